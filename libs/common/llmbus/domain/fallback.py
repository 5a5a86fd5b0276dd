"""Fallback along a route's chain (pure).

When model X can't take a request ("model unavailable" / "out of capacity"), the next
model in the chain gets it; the new RoutedRequest's route_reason records the hop as
"fallback:<from>-><to>:<code>" and its fallback_chain is what is left, so a later
failure continues from there and the chain is never walked twice.
"""

from __future__ import annotations

from collections.abc import Callable

from llmbus.contract.messages import ErrorCode, RoutedRequest, now_ms

# Codes that say "this model, not this request": another model may well succeed.
FALLBACK_CODES = frozenset({ErrorCode.MODEL_UNAVAILABLE, ErrorCode.OVER_CAPACITY, ErrorCode.QUEUE_FULL})


def next_model(
    chain: list[str], failed_model: str, is_available: Callable[[str], bool] | None = None
) -> tuple[str, list[str]] | None:
    """The first usable model of `chain` (not the failed one), and what remains after it."""
    for i, model in enumerate(chain):
        if model == failed_model or (is_available is not None and not is_available(model)):
            continue
        return model, chain[i + 1 :]
    return None


def fall_back(
    routed: RoutedRequest,
    failed_model: str,
    code: ErrorCode,
    is_available: Callable[[str], bool] | None = None,
) -> RoutedRequest | None:
    """The request re-routed to the next model, or None when the code is not a model problem or the chain is spent."""
    if code not in FALLBACK_CODES:
        return None
    picked = next_model(routed.fallback_chain, failed_model, is_available)
    if picked is None:
        return None
    model, rest = picked
    return routed.model_copy(
        update={
            "model": model,
            "fallback_chain": rest,
            "route_reason": f"fallback:{failed_model}->{model}:{code.value}",
            "routed_at_ms": now_ms(),
        }
    )
