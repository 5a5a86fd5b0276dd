"""A release between two versions of one model: the router splits users by version, the scheduler places
each request on a worker of its version, a worker serves the registry's version."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import InferenceRequest, ModelSpec, ModelState, ReleaseStage, WorkerStatus
from llmbus.domain.lifecycle import to_step
from llmbus.domain.registry import by_model, registered
from llmbus.domain.release import follow, start
from llmbus_services.engine_worker.core.registry_version import VersionRefused, registry_spec
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.scheduler.core.plugins.filters_model import ServesModelFilter
from tests.unit.test_model_registry import apply, registry, version
from tests.unit.test_sched_filters import hb, req, state_of

USERS = [f"user-{i}" for i in range(400)]


def released(step: int) -> tuple[RouterCore, str]:
    """A router that knows tiny@1 as serving and the release of tiny@2 at `step` (0 shadow, 1 50 %, 2 100 %)."""
    model = registry(version("1"), version("2"))
    model = apply(model, start(model, "1", by="a", upgrade_id="upg-1").records)
    begun = start(model, "2", by="a", upgrade_id="upg-2")
    assert begun.experiment is not None
    experiment = to_step(begun.experiment, step) if step else begun.experiment
    model = apply(model, begun.records)
    model = apply(model, follow(experiment, model, by="c"))
    core = RouterCore(load_policy(), build_scorer("heuristic"))
    for record in [*model.versions.values(), model.serving]:
        assert record is not None
        core.catalog.apply_spec(record)
    core.experiments.apply(experiment)
    return core, experiment.experiment_id


def ask(user: str) -> InferenceRequest:
    return InferenceRequest(prompt="hello there", model="tiny", user_id=user, max_tokens=8)


async def test_ab_step_splits_users_between_versions_with_the_release_on_each_request() -> None:
    core, upgrade = released(step=1)
    versions: dict[str, str] = {}
    for user in USERS:
        out = await core.route(ask(user))
        assert out.routed is not None and out.routed.model == "tiny" and not out.shadows
        release = out.routed.release
        assert release is not None and release.upgrade_id == upgrade and release.stage == ReleaseStage.AB
        assert release.share_pct == 50 and release.previous_version == "1"
        assert out.routed.variant == ("candidate" if release.model_version == "2" else "control")
        assert out.routed.facts()["release"] == release  # and so on its result, final chunk and cost record
        versions[user] = release.model_version
    assert 0.4 < sum(v == "2" for v in versions.values()) / len(USERS) < 0.6
    again = [(await core.route(ask(u))).routed for u in USERS[:50]]
    assert [r.release.model_version for r in again if r and r.release] == [versions[u] for u in USERS[:50]]


async def test_shadow_step_users_stay_on_the_serving_version_copies_go_to_the_new_one() -> None:
    core, upgrade = released(step=0)
    out = await core.route(ask("user-1"))
    assert out.routed is not None and out.routed.release is not None
    assert (out.routed.release.model_version, out.routed.release.stage) == ("1", ReleaseStage.SHADOW)
    [copy] = out.shadows
    assert copy.shadow and copy.model == "tiny" and copy.release is not None
    assert (copy.release.upgrade_id, copy.release.model_version, copy.release.previous_version) == (upgrade, "2", "1")


async def test_after_promotion_everyone_gets_the_new_serving_version() -> None:
    core, upgrade = released(step=2)
    for user in USERS[:50]:
        out = await core.route(ask(user))
        assert out.routed is not None and out.routed.experiment_id == upgrade and out.routed.variant == "candidate"
        release = out.routed.release
        assert release is not None and (release.upgrade_id, release.model_version) == (upgrade, "2")
        assert release.stage == ReleaseStage.SERVING
        assert release == core.catalog.release_of("tiny")  # what the serving record says too


async def test_the_next_release_closes_the_promoted_one_just_before_it_starts() -> None:
    model = registry(version("1"), version("2"), version("3"))
    model = apply(model, start(model, "1", by="a").records)
    second = start(model, "2", by="a", upgrade_id="upg-2")
    assert second.experiment is not None and second.closes is None  # the first version had no experiment
    promoted = to_step(second.experiment, 2)
    model = apply(model, [*second.records, *follow(promoted, model, by="c")])
    third = start(model, "3", by="a", upgrade_id="upg-3", previous_release=promoted)
    assert third.closes is not None and third.experiment is not None
    assert third.closes.experiment_id == "upg-2" and not third.closes.enabled
    assert (third.experiment.control_version, third.experiment.candidate_version) == ("2", "3")
    core = RouterCore(load_policy(), build_scorer("heuristic"))
    for record in apply(model, third.records).versions.values():
        core.catalog.apply_spec(record)
    assert model.serving is not None
    core.catalog.apply_spec(model.serving)
    for experiment in (promoted, third.closes, third.experiment):  # llm.experiments, in its one partition's order
        core.experiments.apply(experiment)
    out = await core.route(ask("user-7"))
    assert out.routed is not None and out.routed.release is not None
    assert (out.routed.release.upgrade_id, out.routed.release.model_version) == ("upg-3", "2")
    assert [c.release.model_version for c in out.shadows if c.release] == ["3"]


async def test_a_plain_model_carries_no_release_and_version_records_change_no_limits() -> None:
    core = RouterCore(load_policy(), build_scorer("heuristic"))
    before = core.catalog.entry("gpt-4.1-mini")
    core.catalog.apply_spec(registered(ModelSpec(name="gpt-4.1-mini", max_model_len=64), by="a"))
    assert core.catalog.entry("gpt-4.1-mini") == before  # a version record is not the model as served
    out = await core.route(InferenceRequest(prompt="hi", model="gpt-4.1-mini"))
    assert out.routed is not None and out.routed.release is None


def test_scheduler_places_a_release_request_only_on_its_version() -> None:
    workers = [hb("w1", model_version="1"), hb("w2", model_version="2"), hb("w3", model_version=None)]
    state = state_of(*workers)
    kept = ServesModelFilter().filter(state, req(model_version="2"), list(state.fleet.workers.values()))
    assert [w.worker_id for w in kept] == ["w2"]
    anyone = ServesModelFilter().filter(state, req(), list(state.fleet.workers.values()))
    assert sorted(w.worker_id for w in anyone) == ["w1", "w2", "w3"]


def _table(*records: ModelSpec) -> dict[str, ModelSpec]:
    return {r.key: r for r in records}


def test_worker_serves_the_registry_version() -> None:
    model = registry(version("1"), version("2"))
    served = start(model, "1", by="a").records
    table = _table(*model.versions.values(), *served)
    spec, v = registry_spec(table, "tiny", None)
    assert v == "1" and spec is not None and spec.record == "version" and spec.state == ModelState.SERVING
    spec, v = registry_spec(table, "tiny", "2")
    assert v == "2" and spec is not None and spec.state == ModelState.REGISTERED
    with pytest.raises(VersionRefused, match="not in the registry"):
        registry_spec(table, "tiny", "7")
    with pytest.raises(VersionRefused, match="no serving version"):
        registry_spec(_table(*model.versions.values()), "tiny", None)
    retired = by_model(table)["tiny"].versions["1"].model_copy(update={"state": ModelState.RETIRED})
    with pytest.raises(VersionRefused, match="retired"):
        registry_spec(table | {retired.key: retired}, "tiny", "1")
    # Outside the registry: the worker's own word, "1" by default.
    assert registry_spec({}, "sim", None) == (None, "1")
    plain = ModelSpec(name="sim", version="4")
    assert registry_spec({"sim": plain}, "sim", None) == (plain, "4")
    assert registry_spec({"sim": plain}, "sim", "9") == (plain, "9")


def test_heartbeat_version_reaches_the_fleet_view() -> None:
    state = state_of(WorkerStatus(worker_id="w", node_id="n", state="ready", engine="sim", model_version="3"))
    assert state.fleet.workers["w"].model_version == "3"
