"""Cost of one result: hosted tokens, cache hits, shadow booking; self-hosted goes to the GPU ledger.

`price_result` returns either a finished CostRecord (hosted, cache hit, refused, unpriced)
or a `ServedRequest` for the GPU ledger, which prices self-hosted work when the worker's
interval closes (its cost depends on the other requests sharing the GPU then).
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import BookedTo, CostKind, CostRecord, FinishReason, InferenceResult, ResultStatus
from llmbus_services.cost_accounting.core.money import usd
from llmbus_services.cost_accounting.core.prices import PriceBook

NO_EXPERIMENT = "(none)"
PLATFORM_TENANT = "_platform"  # tenant of idle / wasted cold-start records: never a customer
_TEMPLATE = CostRecord(request_id="", tenant="", model="", cost_usd=0.0)


@dataclass(frozen=True)
class ServedRequest:
    """A self-hosted request waiting for its worker's intervals to close."""

    result: InferenceResult
    pool: str
    worker_id: str
    start_ms: int  # engine start (completed - engine time)
    end_ms: int  # completion
    prefill_tokens: int  # prompt tokens the engine computed (cached prefix excluded)
    decode_tokens: int


def booking(result: InferenceResult) -> tuple[BookedTo, str | None]:
    """Shadow copies are the experiment's cost, never the tenant's."""
    if result.shadow:
        return BookedTo.EXPERIMENT, result.experiment_id or NO_EXPERIMENT
    return BookedTo.TENANT, result.experiment_id


def base_record(
    result: InferenceResult, book: PriceBook, kind: CostKind, cost_micro: int, **more: object
) -> CostRecord:
    """The record of one result; `more` sets further CostRecord fields (already valid values)."""
    booked_to, experiment_id = booking(result)
    usage = result.usage
    # A copy of a template with the fields set: every value is computed here from a validated
    # result, and validating again was most of the per-result CPU. All fields go in one update
    # (setting attributes afterwards goes through pydantic's slower __setattr__).
    return _TEMPLATE.model_copy(
        update=dict(
            record_id=result.request_key,  # unique across tenants: two may send one request id
            request_id=result.request_id,
            tenant=result.tenant,
            model=result.model or "",
            kind=kind,
            booked_to=booked_to,
            experiment_id=experiment_id,
            variant=result.variant,
            shadow=result.shadow,
            route_reason=result.route_reason,
            session_id=result.session_id,
            user_id=result.user_id,
            category=result.category,
            tier=result.tier,
            worker_id=result.worker_id,
            cost_micro_usd=cost_micro,
            cost_usd=usd(cost_micro),
            prompt_tokens=usage.prompt_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            completion_tokens=usage.completion_tokens,
            trimmed_prompt_tokens=result.trimmed_tokens,
            baseline_micro_usd=book.list_price_micro(
                book.default_model, usage.prompt_tokens + result.trimmed_tokens, 0, usage.completion_tokens
            ),
            list_price_micro_usd=book.list_price_micro(result.model, usage.prompt_tokens, 0, usage.completion_tokens),
            output_cap_saving_micro_usd=output_cap_saving(result, book),
            booked_at_ms=result.completed_at_ms,
            **more,
        )
    )


def output_cap_saving(result: InferenceResult, book: PriceBook) -> int:
    """At most what the output cap avoided: only an answer that stopped at the cap could have gone on, and
    at most to the client's max_tokens (the true length it would have had is unknowable)."""
    requested = result.max_tokens_requested
    if requested is None or result.finish_reason != FinishReason.LENGTH:
        return 0
    avoided = requested - result.usage.completion_tokens
    return (book.list_price_micro(result.model, 0, 0, avoided) or 0) if avoided > 0 else 0


def price_result(result: InferenceResult, book: PriceBook) -> CostRecord | ServedRequest:
    usage = result.usage
    if result.cached:
        saving = book.list_price_micro(result.model, usage.prompt_tokens, 0, usage.completion_tokens) or 0
        return base_record(result, book, CostKind.CACHE, 0, saving_micro_usd=saving, cached_saving_usd=usd(saving))
    if result.model in book.hosted:
        cost = book.hosted[result.model].cost_micro(
            usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens
        )
        return base_record(result, book, CostKind.HOSTED, cost)
    pool = book.pool_of(result.model, result.worker_id)
    if pool is not None and result.worker_id:
        engine_ms = result.timings.engine_ms or 0.0
        start_ms = result.completed_at_ms - round(engine_ms)
        return ServedRequest(
            result=result,
            pool=pool,
            worker_id=result.worker_id,
            start_ms=min(start_ms, result.completed_at_ms - 1),  # at least 1 ms of GPU time
            end_ms=result.completed_at_ms,
            prefill_tokens=max(0, usage.prompt_tokens - usage.cached_prompt_tokens),
            decode_tokens=usage.completion_tokens,
        )
    if result.status == ResultStatus.ERROR and usage.total_tokens == 0:
        return base_record(result, book, CostKind.NONE, 0)
    return base_record(result, book, CostKind.UNPRICED, 0)
