"""Token-cost saving of tiering, the exact cache and request coalescing on a replayed request mix.

The mix: the Mooncake conversation trace (data/traces/, 12,031 requests over ~59 min: arrival
time, input and output tokens, and per-512-token-block hash ids). Two requests are identical
when their block ids and input length are equal (the trace's own notion of equal text).

Each request is routed by the router's policy (`decide_route`) on features of its own: the
trace's prompt tokens, and complexity + category from a held-out labelled corpus prompt drawn by
the request's identity (identical requests get the same prompt, so the same tier). It is costed
with cost-accounting's price book at list price (`PriceBook.list_price_micro`: hosted per-token
prices, a self-hosted pool's reference price), as cost-accounting books a cache hit's saving.

Replayed in arrival order, per identity:
- a request arriving while an identical one is generating (arrival < that one's end) is
  coalesced: answered from that generation, cost 0 (without coalescing it would cost a full
  generation: the exact cache is filled only when the first one ends);
- one arriving after an identical one ended, within the cache TTL, is an exact-cache hit: cost 0;
- otherwise it generates and pays.
A generation ends at arrival + TTFT target of its tier (policy `latency.targets_ms`) + output
tokens x `tpot_ms` — a service-time model, not a measurement; the coalesced share is shown for
several `tpot_ms`. All requests are taken as deterministic (cacheable): an upper bound.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bench.traces import MOONCAKE_CONVERSATION
from llmbus.contract.messages import InferenceRequest
from llmbus_services.cost_accounting.core.prices import PriceBook, load_pricebook
from llmbus_services.router.core.complexity import ComplexityScorer
from llmbus_services.router.core.config import RouterPolicy
from llmbus_services.router.core.rules import RouteFeatures, decide_route

STRONG_MODEL = "gpt-4.1"


@dataclass(frozen=True)
class TraceRequest:
    arrival_ms: int
    identity: str
    prompt_tokens: int
    completion_tokens: int


def load_mix(path: Path = MOONCAKE_CONVERSATION) -> list[TraceRequest]:
    out = []
    with path.open() as f:
        for line in f:
            row = json.loads(line)
            identity = hashlib.sha256(f"{row['input_length']}:{row['hash_ids']}".encode()).hexdigest()[:16]
            out.append(
                TraceRequest(int(row["timestamp"]), identity, int(row["input_length"]), int(row["output_length"]))
            )
    out.sort(key=lambda r: r.arrival_ms)
    return out


def route_models(
    mix: Iterable[TraceRequest], corpus: list[dict], scorer: ComplexityScorer, policy: RouterPolicy
) -> dict[str, str]:
    """identity → the model the policy routes it to."""
    models: dict[str, str] = {}
    for r in mix:
        if r.identity in models:
            continue
        row = corpus[int(r.identity, 16) % len(corpus)]
        request = InferenceRequest(prompt=row["prompt"], category=row.get("category"))
        features = RouteFeatures(
            complexity=scorer.score(request), prompt_tokens=r.prompt_tokens, category=row.get("category")
        )
        models[r.identity] = decide_route(policy, features).model
    return models


def replay(
    mix: list[TraceRequest], models: dict[str, str], policy: RouterPolicy, book: PriceBook, tpot_ms: float
) -> dict:
    def price(r: TraceRequest, model: str) -> int:
        micro = book.list_price_micro(model, r.prompt_tokens, 0, r.completion_tokens)
        if micro is None:
            raise LookupError(f"the price book has no price for {model}")
        return micro

    default_model = book.default_model or policy.default.target
    totals = dict.fromkeys(("all_strong", "all_default", "tiered", "tiered_exact", "tiered_exact_coalesced"), 0)
    counts = dict.fromkeys(("requests", "coalesced", "exact_hits", "generations"), 0)
    by_model: dict[str, int] = {}
    generating_until: dict[str, int] = {}  # identity → end of its generation in flight
    cached_until: dict[str, int] = {}  # identity → when its cache entry expires
    ttl_ms = policy.cache.ttl_s * 1000
    targets = policy.latency.targets_ms
    for r in mix:
        model = models[r.identity]
        cost = price(r, model)
        counts["requests"] += 1
        by_model[model] = by_model.get(model, 0) + 1
        totals["all_strong"] += price(r, STRONG_MODEL)
        totals["all_default"] += price(r, default_model)
        totals["tiered"] += cost
        in_flight = generating_until.get(r.identity, -1) > r.arrival_ms
        cache_hit = not in_flight and r.arrival_ms < cached_until.get(r.identity, -1)
        if not cache_hit:
            totals["tiered_exact"] += cost  # without coalescing, an in-flight duplicate generates again
        if in_flight:
            counts["coalesced"] += 1
        elif cache_hit:
            counts["exact_hits"] += 1
        else:
            counts["generations"] += 1
            totals["tiered_exact_coalesced"] += cost
            tier = policy.models[model].tier if model in policy.models else "default"
            ttft_ms = targets.get(tier, targets.get("default", 0.0))
            end_ms = r.arrival_ms + int(ttft_ms + r.completion_tokens * tpot_ms)
            generating_until[r.identity] = end_ms
            cached_until[r.identity] = end_ms + ttl_ms
    usd = {k: round(v / 1e6, 2) for k, v in totals.items()}
    base = totals["all_strong"]
    return {
        "tpot_ms": tpot_ms,
        "counts": counts,
        "requests_by_model": dict(sorted(by_model.items())),
        "cost_usd": usd,
        "saving_vs_all_strong_perc": {k: round(100 * (1 - v / base), 2) for k, v in totals.items() if base},
        "coalescing_saving_usd": round((totals["tiered_exact"] - totals["tiered_exact_coalesced"]) / 1e6, 2),
        "exact_cache_saving_usd": round((totals["tiered"] - totals["tiered_exact"]) / 1e6, 2),
    }


def savings_report(corpus: list[dict], scorer: ComplexityScorer, policy: RouterPolicy) -> dict:
    mix = load_mix()
    book = load_pricebook()
    models = route_models(mix, corpus, scorer, policy)
    runs = [replay(mix, models, policy, book, tpot_ms) for tpot_ms in (10.0, 20.0, 40.0)]
    return {
        "trace": MOONCAKE_CONVERSATION.name,
        "requests": len(mix),
        "distinct_requests": len({r.identity for r in mix}),
        "baseline_strong_model": STRONG_MODEL,
        "default_model": book.default_model,
        "cache_ttl_s": policy.cache.ttl_s,
        "by_tpot": runs,
    }
