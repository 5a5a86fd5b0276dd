"""The savings replay's accounting: in flight → coalesced, after the end → exact hit, after the TTL → paid."""

from __future__ import annotations

from bench.router_savings import TraceRequest, replay
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_services.router.core.config import load_policy


def test_duplicates_are_coalesced_while_generating_then_hit_the_cache_until_the_ttl() -> None:
    policy = load_policy()  # cache TTL 3600 s; gpt-4.1-mini is tier "default": TTFT target 1500 ms
    tpot_ms = 10.0  # 100 output tokens → the generation ends 1500 + 1000 ms after arrival
    mix = [
        TraceRequest(0, "a", 1_000_000, 100),
        TraceRequest(2000, "a", 1_000_000, 100),  # in flight → coalesced
        TraceRequest(3000, "a", 1_000_000, 100),  # ended at 2500 → exact-cache hit
        TraceRequest(2500 + 3_600_000, "a", 1_000_000, 100),  # the entry expired → generates again
        TraceRequest(10, "b", 1_000_000, 100),  # another request → generates
    ]
    out = replay(mix, dict.fromkeys("ab", "gpt-4.1-mini"), policy, load_pricebook(), tpot_ms)
    assert out["counts"] == {"requests": 5, "coalesced": 1, "exact_hits": 1, "generations": 3}
    one_usd = 1_000_000 * 0.40 / 1e6 + 100 * 1.60 / 1e6  # the price book's gpt-4.1-mini list price
    assert out["cost_usd"]["tiered"] == round(5 * one_usd, 2)
    assert out["coalescing_saving_usd"] == round(one_usd, 2) == 0.4
    assert out["exact_cache_saving_usd"] == round(one_usd, 2)
    assert out["cost_usd"]["tiered_exact_coalesced"] <= out["cost_usd"]["tiered_exact"] <= out["cost_usd"]["tiered"]


def test_semantic_curve_counts_hits_precision_and_hit_rate() -> None:
    from bench.semantic_cache_eval import curve, recommended

    rows = curve([0.9, 0.8, 0.95, 0.3], [True, True, False, False], [0.5, 0.85, 0.99])
    assert rows[0] == {"threshold": 0.5, "hits": 3, "precision": 0.667, "hit_rate": 1.0}
    assert rows[1] == {"threshold": 0.85, "hits": 2, "precision": 0.5, "hit_rate": 0.5}
    assert rows[2] == {"threshold": 0.99, "hits": 0, "precision": None, "hit_rate": 0.0}
    assert recommended(rows, 0.6) == rows[0] and recommended(rows, 0.9) is None
