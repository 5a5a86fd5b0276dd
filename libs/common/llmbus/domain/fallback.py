"""Fallback along a route's chain (pure).

When model X can't take a request (unavailable, out of capacity, its upstream failing or busy, or the prompt
over its window), the next model in the chain gets it; the new RoutedRequest's route_reason records the hop
as "fallback:<from>-><to>:<code>" and its fallback_chain is what is left, so a later failure continues from
there and the chain is never walked twice. For a prompt over the window the next model is the next one
whose window fits it (`is_available`); none: the request ends prompt_too_long.
"""

from __future__ import annotations

from collections.abc import Callable

from llmbus.contract.messages import ErrorCode, ModelSpec, RoutedRequest, now_ms
from llmbus.domain.adapters import lora_adapter_of

# Codes that say "this model, not this request": another model may well succeed.
FALLBACK_CODES = frozenset(
    {ErrorCode.MODEL_UNAVAILABLE, ErrorCode.OVER_CAPACITY, ErrorCode.QUEUE_FULL, ErrorCode.PROMPT_TOO_LONG}
)


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
    attempts: int = 0,
    specs: dict[str, ModelSpec] | None = None,
) -> RoutedRequest | None:
    """The request re-routed to the next model, or None when the code is not a model problem or the chain is spent.

    `attempts`: the last attempt it had under the failed model; the next model's attempts number on from it
    (a later attempt may continue what an earlier one streamed, so attempt numbers are never reused).
    `specs`: the models' records; the next model's LoRA adapter comes from its own (a chain from an adapter to
    a plain model leaves the adapter behind)."""
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
            "adapter": lora_adapter_of((specs or {}).get(model)),
            "release": None,  # the failed model's release (and version) says nothing about the next one
            "attempts_before": max(routed.attempts_before, attempts),
        }
    )
