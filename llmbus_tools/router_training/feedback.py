"""Training samples from production: llm.feedback joined with llm.routed and llm.results.

A sample is (request, tier it was served by, outcome = the user's feedback score). The
label rule (documented in llmbus_tools/router_training/data/README.md):
- served by a tier other than `strong` and scored >= `good` → "low" (the cheaper tier was enough);
- scored < `bad` on any tier → "high" (the request needed more than it got);
- served by `strong` and scored well → no sample: nothing says a cheaper tier would have done.
Shadow copies, failed results and scores in between are skipped.

Feedback counts only from the tenant whose request it was (the result's tenant). With auth on
its tenant is the topic's (`llm.feedback.<tenant>`, which only that tenant may write; the shared
`llm.feedback` only the gateway); a body claiming another tenant is dropped. Dev mode reads the
shared topic and takes the tenant the body names.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping

from llmbus.bus.admin import topics_matching
from llmbus.bus.tables import read_log, read_table
from llmbus.contract import topics as t
from llmbus.contract.messages import Feedback, InferenceResult, ResultStatus, RoutedRequest
from llmbus.security import tenancy
from llmbus.settings import BusSettings
from llmbus_services.router.core.config import RouterPolicy
from llmbus_services.router.core.learned import scored_text_and_depth

log = logging.getLogger(__name__)

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
    feedback: Iterable[Feedback],
    policy: RouterPolicy,
) -> list[dict]:
    """One labelled row per request that has feedback from its own tenant, an OK result and a routed
    record (by request id). `feedback` in log order, each with its authenticated tenant: the latest
    feedback of the result's tenant counts; another tenant's never does, nor hides the owner's."""
    own: dict[str, Feedback] = {}
    for fb in feedback:
        r = routed.get(fb.request_id)
        res = results.get(fb.request_id)
        if r is not None and res is not None and fb.tenant == res.tenant == r.request.tenant:
            own[fb.request_id] = fb
    rows = []
    for request_id, fb in sorted(own.items()):
        r, res = routed[request_id], results[request_id]
        if r.shadow or res.shadow or res.status != ResultStatus.OK:
            continue
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
    feedback = await read_feedback(settings, timeout_s)
    return join_samples(routed, results, feedback, policy)


def authenticated(topic_base: str, feedback: Feedback) -> Feedback | None:
    """`feedback` as its authenticated tenant's, read from `topic_base`; None when refused."""
    try:
        tenant = tenancy.check_tenant(tenancy.feedback_source_of(topic_base), feedback.tenant, what="feedback")
    except tenancy.Refused as refused:
        log.warning("feedback on %s dropped: %s", feedback.request_id, refused.reason)
        return None
    return feedback.model_copy(update={"tenant": tenant})


async def read_feedback(settings: BusSettings, timeout_s: float) -> list[Feedback]:
    """Every feedback record with its authenticated tenant: the shared topic, and each tenant's when auth is on."""
    prefix = settings.topic_prefix
    if settings.auth_enabled:
        topics = await topics_matching(settings, re.compile(tenancy.feedback_topic_pattern(prefix)))
    else:
        topics = [t.Topics(prefix).name(t.FEEDBACK)]
    feedback = []
    for topic in topics:
        for _, fb in await read_log(settings, topic, Feedback, timeout_s):
            if (mine := authenticated(topic.removeprefix(prefix), fb)) is not None:
                feedback.append(mine)
    return feedback
