"""An operator's `experiments stop` (and a release's `models rollback`) against the comparator's
promotion, on the real broker and Redis.

The comparator decides on the experiment as it last read it. A stop written after that read, and
before the comparator publishes its promotion, used to be undone by it: the router keeps the last
record. Experiment records now carry a version set by compare-and-set, the comparator's change
applies only on the version it read, and readers keep the highest version.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from llmbus.bus.service import ServiceRuntime
from llmbus.bus.tables import read_log, read_table
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import Experiment, ExperimentDecision, ExperimentState, ModelSpec, ModelState
from llmbus.domain.lifecycle import next_version, share_pct, to_step
from llmbus.settings import BusSettings
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus.state.store import redis_client
from llmbus_services.router.core.experiments import ExperimentBook
from llmbus_services.shadow_comparator.app import build, decide_once
from llmbus_services.shadow_comparator.config import ComparatorSettings
from llmbus_services.shadow_comparator.core.decide import Verdict
from llmbus_services.shadow_comparator.flows import ComparatorHandlers
from tests.integration.test_experiments_cli import run as cli

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


async def experiments(settings: BusSettings) -> dict[str, Experiment]:
    return await read_table(settings, t.Topics(settings.topic_prefix).name(t.EXPERIMENTS), Experiment)


async def as_the_router_reads_it(settings: BusSettings, experiment_id: str) -> Experiment:
    """Every record of llm.experiments through the router's ExperimentBook, in log order."""
    book = ExperimentBook()
    for _, experiment in await read_log(settings, t.Topics(settings.topic_prefix).name(t.EXPERIMENTS), Experiment):
        book.apply(experiment)
    return book._by_id[experiment_id]


def promote(handlers: ComparatorHandlers, experiment_id: str) -> None:
    """The comparator's next decide_all: promote one step, from the experiment as its view holds it."""
    seen = handlers.comparator.experiments.by_id[experiment_id]
    updated = to_step(seen, seen.step + 1, note="guardrails hold")
    decision = ExperimentDecision(
        experiment_id=experiment_id,
        decision="promote",
        step_from=seen.step,
        step_to=updated.step,
        share_from_pct=share_pct(seen),
        share_to_pct=share_pct(updated),
        state=updated.state,
    )

    async def decide_all() -> list[Verdict]:
        return [Verdict(decision, updated)]

    handlers.comparator.decide_all = decide_all  # type: ignore[method-assign]


async def comparator(settings: BusSettings) -> tuple[ServiceRuntime, ComparatorHandlers]:
    runtime = await ServiceRuntime.connect(settings, contracts.COMPARATOR)
    return runtime, build(runtime, ComparatorSettings(decide=False))


async def test_a_stop_the_comparator_has_not_read_yet_is_not_undone_by_its_promotion(bus_settings: BusSettings) -> None:
    s = bus_settings
    await asyncio.to_thread(cli, s, "experiments", "create", "e1", "--control", "m1", "--candidate", "m2")
    runtime, handlers = await comparator(s)
    try:
        handlers.comparator.experiments.apply((await experiments(s))["e1"])  # the comparator's view: running
        await asyncio.to_thread(cli, s, "experiments", "stop", "e1")  # the operator, before the next tick
        promote(handlers, "e1")  # decided on the view it read before the stop
        await decide_once(handlers)
    finally:
        await runtime.stop()
        await handlers.comparator.store.close()
    routed = await as_the_router_reads_it(s, "e1")
    assert routed.state == ExperimentState.STOPPED and not routed.enabled, "the promotion undid the stop"
    assert share_pct(routed) == 0
    assert handlers.comparator.experiments.by_id["e1"].state == ExperimentState.STOPPED  # its view caught up


async def test_a_stop_on_a_stale_read_applies_on_top_of_the_promotion(bus_settings: BusSettings) -> None:
    """The other order: the promotion is in first, the operator's tool read the experiment before it.
    The stop's compare-and-set fails, it is applied again on the newest version, and it wins."""
    from llmbus.cli.experiments import write_experiment
    from llmbus.domain.lifecycle import with_state

    s = bus_settings
    await asyncio.to_thread(cli, s, "experiments", "create", "e2", "--control", "m1", "--candidate", "m2")
    read_by_operator = (await experiments(s))["e2"]
    runtime, handlers = await comparator(s)
    try:
        handlers.comparator.experiments.apply(read_by_operator)
        promote(handlers, "e2")
        await decide_once(handlers)  # promoted: version read + 1
    finally:
        await runtime.stop()
        await handlers.comparator.store.close()
    promoted = (await experiments(s))["e2"]
    assert promoted.step == 1 and promoted.version == read_by_operator.version + 1
    stopped = await write_experiment(
        s, read_by_operator, lambda e: with_state(e, ExperimentState.STOPPED, note="operator stopped")
    )
    assert stopped.version == promoted.version + 1 and stopped.state == ExperimentState.STOPPED
    routed = await as_the_router_reads_it(s, "e2")
    assert routed.state == ExperimentState.STOPPED and routed.version == stopped.version


async def released(s: BusSettings, tmp_path: Path) -> str:
    """tiny@1 serving, tiny@2 released into shadow by the CLI: the release's upgrade id."""
    for version in ("1", "2"):
        files = [{"path": "model.safetensors", "sha256": "b" * 64, "size_bytes": 4096}]
        artifacts = [{"format": "bf16", "uri": f"file:///models/tiny/{version}/bf16/", "files": files}]
        body = {"name": "tiny", "version": version, "owner": "ml", "context_length_tokens": 2048}
        (tmp_path / f"v{version}.yaml").write_text(yaml.safe_dump(body | {"artifacts": artifacts}))
        await asyncio.to_thread(cli, s, "models", "register", "-f", str(tmp_path / f"v{version}.yaml"))
    await asyncio.to_thread(cli, s, "models", "release", "tiny@1")  # the first version serves at once
    await asyncio.to_thread(cli, s, "models", "release", "tiny@2")  # shadow
    release = (await registry(s))["tiny@2"].release
    assert release is not None
    return release.upgrade_id


async def registry(s: BusSettings) -> dict[str, ModelSpec]:
    return await read_table(s, t.Topics(s.topic_prefix).name(t.MODELS), ModelSpec)


async def test_a_release_rolled_back_by_the_operator_stays_rolled_back_in_the_router_and_the_registry(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    """`llmbus models rollback` writes by compare-and-set too: the comparator's promotion of the release,
    decided on the shadow step it read before the rollback, moves neither the users nor the registry."""
    s = bus_settings
    upgrade = await released(s, tmp_path)
    runtime, handlers = await comparator(s)
    try:
        handlers.comparator.models.update(await registry(s))
        handlers.comparator.experiments.apply((await experiments(s))[upgrade])  # its view: shadow, running
        await asyncio.to_thread(cli, s, "models", "rollback", "tiny", "--reason", "bad answers")
        promote(handlers, upgrade)  # shadow → the first A/B step, decided on the view from before the rollback
        await decide_once(handlers)
    finally:
        await runtime.stop()
        await handlers.comparator.store.close()
    routed = await as_the_router_reads_it(s, upgrade)
    assert routed.state == ExperimentState.STOPPED and not routed.enabled, "the promotion undid the rollback"
    models = await registry(s)
    assert models["tiny@2"].state == ModelState.REGISTERED, "the registry followed the refused promotion"
    assert models["tiny"].version == "1"
    decisions = await read_log(s, t.Topics(s.topic_prefix).name(t.DECISIONS), ExperimentDecision)
    assert not [d for key, d in decisions if key == upgrade], "a decision that was not applied is on the log"


async def test_a_release_step_written_and_never_published_is_published_with_its_registry_records(
    bus_settings: BusSettings, tmp_path: Path
) -> None:
    """An operator's ramp won the compare-and-set and its tool died before publishing it. The comparator,
    refused on its older read, publishes the version in force, and the registry follows it (canary)."""
    s = bus_settings
    upgrade = await released(s, tmp_path)
    read = (await experiments(s))[upgrade]
    client = redis_client(s.redis_url, password=s.redis_password)
    try:
        ramped = next_version(read, to_step(read, 1, note="operator ramp to 1 %"))
        assert (await ExperimentVersions(client, s.topic_prefix).compare_and_set(read.version, ramped))[0]
    finally:
        await client.aclose()
    runtime, handlers = await comparator(s)
    try:
        handlers.comparator.models.update(await registry(s))
        handlers.comparator.experiments.apply(read)
        promote(handlers, upgrade)
        await decide_once(handlers)
    finally:
        await runtime.stop()
        await handlers.comparator.store.close()
    routed = await as_the_router_reads_it(s, upgrade)
    assert (routed.version, routed.step, routed.note) == (ramped.version, 1, "operator ramp to 1 %")
    candidate = (await registry(s))["tiny@2"]
    assert candidate.state == ModelState.CANARY and candidate.release is not None
    assert candidate.release.share_pct == 1 and candidate.transitions[-1].by == "shadow-comparator"
