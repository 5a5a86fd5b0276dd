"""Tier TTFT targets: the window, the quantile, the fallback choice, the stamp on routed requests."""

from __future__ import annotations

from llmbus.contract.messages import InferenceRequest, InferenceResult, ResultStatus, Timings
from llmbus_services.router.adapters.latency_watch import LatencyReporter
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import LatencyPolicy, load_policy
from llmbus_services.router.core.latency import TierLatencyWatch, avoid_missing_tier
from llmbus_services.router.core.pipeline import RouterCore


def test_policy_defaults_are_the_design_targets() -> None:
    assert load_policy().latency.targets_ms == {"strong": 5000, "mid": 800, "small": 100, "default": 1500}


def test_missing_needs_enough_samples_in_the_window_above_the_target() -> None:
    w = TierLatencyWatch(LatencyPolicy(window_s=10, min_samples=3, quantile=0.9))
    for i in range(2):
        w.observe("mid", 2000, at_s=100 + i)
    assert not w.missing("mid", 102)  # two samples: too few to say
    w.observe("mid", 2000, at_s=102)
    assert w.missing("mid", 102)
    assert not w.missing("mid", 113)  # the slow ones left the window
    for i in range(10):
        w.observe("mid", 100 if i < 9 else 5000, at_s=120)
    v = w.verdict("mid", 120)
    assert v is not None and v.observed_ms == 5000 and v.missing  # p90 of 10 = the slowest
    assert w.verdict("sim", 120) is None  # no target, no verdict


def test_avoid_missing_tier_takes_the_first_fallback_on_time() -> None:
    w = TierLatencyWatch(LatencyPolicy(min_samples=1, prefer_fallback_while_missing=True))
    tiers = {"a": "mid", "b": "default", "c": "small"}
    w.observe("mid", 5000, 0)
    w.observe("default", 5000, 0)
    assert avoid_missing_tier("a", ["b", "c"], tiers.__getitem__, w, 1) == ("c", [], "latency_fallback:a->c:mid")
    assert avoid_missing_tier("c", ["a"], tiers.__getitem__, w, 1) is None  # small is on time
    w.policy = LatencyPolicy(min_samples=1, prefer_fallback_while_missing=False)
    assert avoid_missing_tier("a", ["b", "c"], tiers.__getitem__, w, 1) is None  # report only


async def test_routed_requests_carry_their_tier_target_and_results_feed_the_watch() -> None:
    policy = load_policy()
    watch = TierLatencyWatch(policy.latency)
    core = RouterCore(policy, build_scorer("constant", {"value": 0.1}), latency=watch)
    out = await core.route(InferenceRequest(prompt="hi", category="quick_edit"))
    assert out.routed is not None
    assert out.routed.request.metadata["llmbus.tier"] == "small"
    assert out.routed.request.metadata["llmbus.latency_target_ms"] == "100"
    reporter = LatencyReporter(core, watch)
    model = out.routed.model
    ok = InferenceResult(request_id="r", tenant="default", status=ResultStatus.OK, model=model)
    for _ in range(policy.latency.min_samples):
        v = reporter.on_result(ok.model_copy(update={"timings": Timings(ttft_ms=250.0)}), now_s=5)
    assert v is not None and v.missing and "tier small" in reporter.status_lines(now_s=5)[-2]
    cached = ok.model_copy(update={"timings": Timings(ttft_ms=1.0), "cached": True})
    assert reporter.on_result(cached, now_s=5) is None  # cache hits say nothing about the tier
