"""Training samples from production: llm.feedback joined with llm.routed and llm.results.

A sample is (request, tier it was served by, outcome = the user's feedback score). The
label rule (documented in services/router/data/README.md):
- served by a tier other than `strong` and scored >= `good` → "low" (the cheaper tier was enough);
- scored < `bad` on any tier → "high" (the request needed more than it got);
- served by `strong` and scored well → no sample: nothing says a cheaper tier would have done.
Shadow copies, failed results and scores in between are skipped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from llmbus import topics as t
from llmbus.bus.tables import read_table
from llmbus.messages import Feedback, InferenceResult, ResultStatus, RoutedRequest
from llmbus.settings import BusSettings
from services.router.policy.config import RouterPolicy
from services.router.policy.learned import scored_text_and_depth

GOOD_SCORE = 0.7
BAD_SCORE = 0.4


def label_of(tier: str, score: float, good: float = GOOD_SCORE, bad: float = BAD_SCORE) -> str | None:
    if score < bad:
        return "high"
    if score >= good and tier != "strong":
        return "low"
    return None


def join_samples(
    routed: Mapping[str, RoutedRequest],
    results: Mapping[str, InferenceResult],
    feedback: Mapping[str, Feedback],
    policy: RouterPolicy,
) -> list[dict]:
    """One labelled row per request that has feedback, an OK result and a routed record (by request id)."""
    rows = []
    for request_id, fb in sorted(feedback.items()):
        r = routed.get(request_id)
        res = results.get(request_id)
        if r is None or res is None or r.shadow or res.shadow or res.status != ResultStatus.OK:
            continue
        if fb.tenant != r.request.tenant:
            continue  # feedback must come from the request's own tenant
        model = res.model or r.model
        tier = policy.models[model].tier if model in policy.models else "unknown"
        label = label_of(tier, fb.score)
        if label is None:
            continue
        text, depth, has_system = scored_text_and_depth(r.request)
        rows.append(
            {
                "id": request_id,
                "prompt": text,
                "category": r.request.category,
                "turns": depth + 1,
                "system": has_system,
                "label": label,
                "group": "feedback:" + hashlib.blake2b(request_id.encode(), digest_size=6).hexdigest(),
                "source": "feedback",
                "tier": tier,
                "score": fb.score,
            }
        )
    return rows


async def collect_samples(settings: BusSettings, policy: RouterPolicy, timeout_s: float = 30.0) -> list[dict]:
    """Read llm.routed, llm.results and llm.feedback to their current ends and join them."""
    names = t.Topics(settings.topic_prefix)
    routed = await read_table(settings, names.name(t.ROUTED), RoutedRequest, timeout_s, key_of=lambda r: r.request_id)
    results = await read_table(
        settings, names.name(t.RESULTS), InferenceResult, timeout_s, key_of=lambda r: r.request_id
    )
    feedback = await read_table(settings, names.name(t.FEEDBACK), Feedback, timeout_s, key_of=lambda f: f.request_id)
    return join_samples(routed, results, feedback, policy)
