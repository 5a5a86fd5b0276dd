"""The comparator's join and aggregates on the real Redis: out of order, duplicated, late, missing, restarted."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as redis

from llmbus.contract.messages import (
    Comparison,
    CostRecord,
    ErrorCode,
    ErrorInfo,
    Experiment,
    ExperimentState,
    Feedback,
    InferenceResult,
    RampPlan,
    ResultStatus,
    Timings,
    Usage,
    now_ms,
)
from llmbus.domain.lifecycle import create, next_version, to_step, with_state
from llmbus_services.shadow_comparator.adapters.store import ComparatorStore
from llmbus_services.shadow_comparator.core.aggregates import PAIRS, PairStats, VariantStats
from llmbus_services.shadow_comparator.core.comparator import Comparator, ExperimentView
from tests.support import redis_keys

pytestmark = pytest.mark.redis


class Harness:
    def __init__(self, client: redis.Redis, namespace: str, view: ExperimentView) -> None:
        self.published: list[Comparison] = []
        self.store = ComparatorStore(client, namespace, pair_ttl_s=60)
        self.comparator = Comparator(self.store, view, self.publish)

    async def publish(self, comparison: Comparison) -> None:
        self.published.append(comparison)


def shadow_view() -> ExperimentView:
    view = ExperimentView()
    view.apply(create("exp", "ctrl", "cand"))
    return view


def res(rid: str, *, shadow: bool = False, text: str = "a b c", total_ms: float = 100, **kw: object) -> InferenceResult:
    return InferenceResult(
        request_id=rid,
        tenant="t",
        status=ResultStatus.OK,
        model="cand" if shadow else "ctrl",
        text=text,
        usage=Usage(completion_tokens=3),
        timings=Timings(ttft_ms=10, total_ms=total_ms),
        shadow=shadow,
        **kw,  # type: ignore[arg-type]
    )


def ab_view() -> ExperimentView:
    view = ExperimentView()
    view.apply(to_step(create("exp", "ctrl", "cand"), 2))
    return view


async def pair_stats(h: Harness) -> PairStats:
    return PairStats.from_fields(await h.store.read_agg("exp", 0, PAIRS))


async def test_pairs_join_in_either_order_and_count_once(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, shadow_view())
    await h.comparator.on_result(res("a"))
    await h.comparator.on_result(res("a.shadow.exp", shadow=True, total_ms=150))
    await h.comparator.on_result(res("b.shadow.exp", shadow=True, text="x y z"))  # shadow first
    await h.comparator.on_result(res("b"))
    assert sorted(c.comparison_id for c in h.published) == ["t:a:exp", "t:b:exp"]
    stats = await pair_stats(h)
    assert stats.n == 2 and stats.similarity_mean == pytest.approx(0.5)
    assert (await h.store.stats())["pairs"] == 2


async def test_duplicates_never_count_twice(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, shadow_view())
    for record in [res("a"), res("a"), res("a.shadow.exp", shadow=True), res("a.shadow.exp", shadow=True), res("a")]:
        await h.comparator.on_result(record)
    assert [c.comparison_id for c in h.published] == ["t:a:exp"]
    assert (await pair_stats(h)).n == 1
    stats = await h.store.stats()
    assert stats["pairs"] == 1 and stats["duplicate"] == 3


async def test_restart_between_publish_and_count_republishes_the_same_id_and_counts_once(
    client: redis.Redis, namespace: str
) -> None:
    first = Harness(client, namespace, shadow_view())

    async def crash(_: Comparison) -> None:
        raise ConnectionError("killed before the offset was committed")

    first.comparator.publish_comparison = crash
    await first.comparator.on_result(res("a"))
    with pytest.raises(ConnectionError):
        await first.comparator.on_result(res("a.shadow.exp", shadow=True))
    # A new process gets the uncommitted shadow result again.
    second = Harness(client, namespace, shadow_view())
    await second.comparator.on_result(res("a.shadow.exp", shadow=True))
    await second.comparator.on_result(res("a.shadow.exp", shadow=True))  # and once more, after the commit was lost
    assert [c.comparison_id for c in second.published] == ["t:a:exp"]
    assert (await pair_stats(second)).n == 1


async def test_missing_partners_are_swept_and_late_ones_counted(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, shadow_view())
    await h.comparator.on_result(res("lonely.shadow.exp", shadow=True))  # its primary never comes
    await h.comparator.on_result(res("unshadowed"))  # not mirrored (or its shadow was lost)
    await h.comparator.on_result(res("paired"))
    await h.comparator.on_result(res("paired.shadow.exp", shadow=True))
    assert await h.comparator.sweep(now_ms()) == {}  # nothing due yet
    swept = await h.comparator.sweep(now_ms() + 61_000)
    assert swept == {"missing_primary": 1, "unshadowed_primary": 1}
    await h.comparator.on_result(res("lonely"))  # arrives after its pair was given up
    stats = await h.store.stats()
    assert stats["late_primary"] == 1 and stats["pairs"] == 1
    assert not await redis_keys(client, h.store.key("pair", "*"))  # state bounded


async def test_primaries_no_shadow_experiment_covers_are_not_held(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, ExperimentView())
    await h.comparator.on_result(res("a"))
    assert not await redis_keys(client, h.store.key("pair", "*"))


async def test_a_pair_mirrored_before_a_promote_is_still_compared_after_it(client: redis.Redis, namespace: str) -> None:
    """The ramp leaves its shadow step (the experiment becomes an A/B one) between a shadow's arrival and its
    primary's: that pair is compared all the same. A primary whose shadow is not waiting is not held after
    the promote; once the linger (the pairs' TTL) has passed, primaries are not even offered."""
    view = shadow_view()
    h = Harness(client, namespace, view)
    shadowed = view.by_id["exp"]
    await h.comparator.on_result(res("in-flight.shadow.exp", shadow=True))  # mirrored while it was a shadow one
    view.apply(next_version(shadowed, to_step(shadowed, 1)))  # promoted: no shadow model any more
    assert not view.may_be_shadowed("ctrl") and view.recently_shadowed("ctrl", now_ms())
    await h.comparator.on_result(res("in-flight"))
    await h.comparator.on_result(res("after-the-promote"))  # never mirrored
    assert [c.comparison_id for c in h.published] == ["t:in-flight:exp"]
    assert (await pair_stats(h)).n == 1
    held = await redis_keys(client, h.store.key("pair", "*"))
    assert held and all("in-flight" in str(key) for key in held), held  # the never-mirrored primary is not held
    assert not view.recently_shadowed("ctrl", now_ms() + view.linger_ms + 1)


async def test_a_pair_the_router_mirrored_is_compared_once_in_either_order_after_a_rollback_and_restarts(
    client: redis.Redis, namespace: str
) -> None:
    """The comparator reads llm.results behind llm.experiments: the rollback it decided is applied at once,
    while results of requests mirrored before it are still to be read, primary or shadow first, and it may
    restart in between (its view then rebuilt from llm.experiments alone). A primary whose result says the
    router mirrored it is held whatever the view: each such pair is compared once; a primary not mirrored
    is not held."""
    view = shadow_view()
    first = Harness(client, namespace, view)
    shadowed = view.by_id["exp"]
    rolled_back = next_version(shadowed, with_state(shadowed, ExperimentState.ROLLED_BACK))
    mirrored: dict[str, Any] = {"shadowed_by": ["exp"]}
    await first.comparator.on_result(res("before", **mirrored))  # read before the rollback
    view.apply(rolled_back)
    assert not view.may_be_shadowed("ctrl")
    await first.comparator.on_result(res("primary-first", **mirrored))
    await first.comparator.on_result(res("shadow-first.shadow.exp", shadow=True))
    await first.comparator.on_result(res("not-mirrored", shadowed_by=[]))
    # SIGKILL; the new process knows the experiment only as rolled back (no linger), and reads again
    # what was not committed.
    restarted = ExperimentView()
    restarted.apply(rolled_back)
    second = Harness(client, namespace, restarted)
    await second.comparator.on_result(res("primary-first", **mirrored))  # redelivered
    await second.comparator.on_result(res("primary-first.shadow.exp", shadow=True))
    await second.comparator.on_result(res("shadow-first", **mirrored))
    await second.comparator.on_result(res("before.shadow.exp", shadow=True))
    third = Harness(client, namespace, restarted)
    for record in [res("primary-first.shadow.exp", shadow=True), res("shadow-first", **mirrored)]:
        await third.comparator.on_result(record)  # redelivered once more after another crash
    published = [c.comparison_id for c in first.published + second.published + third.published]
    assert sorted(published) == ["t:before:exp", "t:primary-first:exp", "t:shadow-first:exp"]
    assert (await pair_stats(first)).n == 3
    held = await redis_keys(client, first.store.key("pair", "*"))
    assert not any("not-mirrored" in str(key) for key in held), held


async def test_ab_results_costs_and_feedback_join_by_request_id_once(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, ab_view())
    for i in range(10):
        variant = "candidate" if i % 2 else "control"
        r = res(f"r{i}", experiment_id="exp", variant=variant)
        r = r.model_copy(update={"model": "cand" if i % 2 else "ctrl"})  # each variant's model answered
        await h.comparator.on_result(r)
        await h.comparator.on_result(r)  # redelivered
        cost = CostRecord(request_id=f"r{i}", tenant="t", model="m", cost_usd=0.01 * (1 + i % 2))
        await h.comparator.on_cost(cost)
        await h.comparator.on_cost(cost)
        await h.comparator.on_feedback(Feedback(request_id=f"r{i}", tenant="t", score=0.0 if i % 2 else 1.0))
    await h.comparator.on_feedback(Feedback(request_id="never-seen", tenant="t", score=1.0))
    cand = VariantStats.from_fields(await h.store.read_agg("exp", 2, "candidate"))
    ctrl = VariantStats.from_fields(await h.store.read_agg("exp", 2, "control"))
    assert cand.n == 5 and ctrl.n == 5
    assert cand.cost_per_request_usd == pytest.approx(0.02) and ctrl.cost_per_request_usd == pytest.approx(0.01)
    assert cand.negative_feedback_rate == 1.0 and ctrl.negative_feedback_rate == 0.0
    assert (await h.store.stats())["feedback_unjoined"] == 1


async def test_feedback_from_another_tenant_is_not_counted_and_does_not_preempt_the_owners(
    client: redis.Redis, namespace: str
) -> None:
    h = Harness(client, namespace, ab_view())
    await h.comparator.on_result(
        res("r", experiment_id="exp", variant="candidate").model_copy(update={"tenant": "globex", "model": "cand"})
    )
    await h.comparator.on_feedback(Feedback(request_id="r", tenant="acme", score=0.0))  # first, but not globex's
    await h.comparator.on_feedback(Feedback(request_id="r", tenant="globex", score=1.0))
    cand = VariantStats.from_fields(await h.store.read_agg("exp", 2, "candidate"))
    assert cand.feedback_n == 1 and cand.negative_feedback_rate == 0.0
    stats = await h.store.stats()
    assert stats["feedback_unjoined"] == 1 and stats["feedback_joined"] == 1  # acme's own `r`: none


async def test_a_link_stored_under_the_bare_request_id_joins_only_its_own_tenant(
    client: redis.Redis, namespace: str
) -> None:
    """A link written by a comparator from before request keys (`req:<request id>`) is still read."""
    h = Harness(client, namespace, ab_view())
    await client.set(h.store.key("req", "old"), "exp|2|candidate|globex", ex=60)
    await h.comparator.on_feedback(Feedback(request_id="old", tenant="acme", score=0.0))
    await h.comparator.on_feedback(Feedback(request_id="old", tenant="globex", score=1.0))
    await h.comparator.on_cost(CostRecord(request_id="old", tenant="globex", model="cand", cost_usd=0.5))
    cand = VariantStats.from_fields(await h.store.read_agg("exp", 2, "candidate"))
    assert (cand.feedback_n, cand.negative_feedback_rate, cand.cost_n) == (1, 0.0, 1)
    stats = await h.store.stats()
    assert (stats["feedback_foreign"], stats["feedback_joined"], stats["cost_joined"]) == (1, 1, 1)


async def test_decide_reads_the_current_steps_aggregates(client: redis.Redis, namespace: str) -> None:
    view = ExperimentView()
    exp = create("exp", "ctrl", "cand")
    exp = exp.model_copy(update={"ramp": exp.ramp.model_copy(update={"min_samples_per_step": 40, "min_step_s": 0})})  # type: ignore[union-attr]
    view.apply(exp)
    h = Harness(client, namespace, view)
    for i in range(45):
        await h.comparator.on_result(res(f"p{i}"))
        await h.comparator.on_result(res(f"p{i}.shadow.exp", shadow=True))
    (verdict,) = await h.comparator.decide_all()
    assert verdict.decision.decision == "promote" and verdict.updated is not None
    assert isinstance(verdict.updated, Experiment) and verdict.updated.step == 1


async def test_one_decider_at_a_time(client: redis.Redis, namespace: str) -> None:
    h = Harness(client, namespace, ExperimentView())
    assert await h.store.lead("a", 5) and await h.store.lead("a", 5)
    assert not await h.store.lead("b", 5)


async def test_only_answers_of_the_variants_own_model_are_its_samples(client: redis.Redis, namespace: str) -> None:
    """A tenant picks its buckets and its prompts: cache hits, coalesced answers, another model's
    answers (the candidate has no workers: the scheduler fell back) and the caller's own errors in
    the candidate's bucket are not the candidate's samples. With only those it holds, not promotes."""
    exp = to_step(create("exp", "ctrl", "cand", ramp=RampPlan(min_samples_per_step=20, min_step_s=0)), 2)
    view = ExperimentView()
    view.apply(exp)
    h = Harness(client, namespace, view)
    ab: dict[str, Any] = {"experiment_id": "exp"}
    for i in range(40):
        await h.comparator.on_result(res(f"c{i}", variant="control", **ab))
        steers: list[dict[str, Any]] = [
            {"model": "cand", "cached": True, "route_reason": "cache_hit:default"},
            {"model": "cand", "route_reason": "coalesced:c0:default", "produced_by": "router"},
            {"model": "ctrl", "route_reason": "fallback:cand->ctrl:model_unavailable"},
            {"model": "ctrl"},  # served by another model, whatever the route said
            {"model": "cand", "status": ResultStatus.ERROR, "error": ErrorInfo.of(ErrorCode.RATE_LIMITED, "slow down")},
        ]
        steer = steers[i % 5]
        await h.comparator.on_result(res(f"k{i}", variant="candidate", **ab).model_copy(update=steer))
    cand = VariantStats.from_fields(await h.store.read_agg("exp", 2, "candidate"))
    assert cand.n == 0
    stats = await h.store.stats()
    assert (stats["not_a_sample_not_generated"], stats["not_a_sample_other_model"]) == (16, 16)
    assert stats["not_a_sample_caller_error"] == 8
    (verdict,) = await h.comparator.decide_all()
    assert verdict.decision.decision == "hold" and verdict.updated is None

    # the candidate's own answers and its own errors (no worker took it) are its samples
    await h.comparator.on_result(res("own", variant="candidate", **ab).model_copy(update={"model": "cand"}))
    failed = {"model": "cand", "status": ResultStatus.ERROR, "error": ErrorInfo.of(ErrorCode.DEADLINE_EXCEEDED, "x")}
    await h.comparator.on_result(res("own-err", variant="candidate", **ab).model_copy(update=failed))
    cand = VariantStats.from_fields(await h.store.read_agg("exp", 2, "candidate"))
    assert (cand.n, cand.ok, cand.errors) == (2, 1, 1)
