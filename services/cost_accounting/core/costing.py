"""Cost of one result: hosted tokens, cache hits, shadow booking; self-hosted goes to the GPU ledger.

`price_parts` returns what prices the result: finished CostRecords (hosted, cache hit, refused,
unpriced) and `ServedRequest`s for the GPU ledger, which prices self-hosted work when the worker's
interval closes (its cost depends on the other requests sharing the GPU then). An answer of one
leg is one of them (`price_result`). A continued answer (InferenceResult.legs, docs/delivery.md) is billed per leg,
each at its own model's price or on its own worker's ledger: its last leg under the request's key
(the record that counts the request), every leg before it under `<request key>#leg<n>`, so the
answer's cost is the sum of its legs' and no leg is billed twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import (
    BookedTo,
    CostKind,
    CostRecord,
    FinishReason,
    InferenceResult,
    Leg,
    ResultStatus,
    Usage,
)
from llmbus_services.cost_accounting.core.money import usd
from llmbus_services.cost_accounting.core.prices import PriceBook

NO_EXPERIMENT = "(none)"
PLATFORM_TENANT = "_platform"  # tenant of idle / wasted cold-start records: never a customer
_TEMPLATE = CostRecord(request_id="", tenant="", model="", cost_usd=0.0)


def leg_record_id(request_key: str, leg: int | None) -> str:
    """The record id of a result's record (`leg` None) or of one leg before its last."""
    return request_key if leg is None else f"{request_key}#leg{leg}"


@dataclass(frozen=True)
class Priced:
    """What one record prices: the whole answer (`leg` None and no `part`), or one of its legs (`part`; `leg`,
    its index, only for a leg before the last)."""

    model: str | None
    worker_id: str | None
    usage: Usage
    leg: int | None = None
    part: Leg | None = None

    @classmethod
    def whole(cls, result: InferenceResult) -> Priced:
        return cls(result.model, result.worker_id, result.usage)

    @classmethod
    def of_leg(cls, leg: Leg, index: int | None) -> Priced:
        usage = Usage(
            prompt_tokens=leg.prompt_tokens,
            cached_prompt_tokens=leg.cached_prompt_tokens,
            completion_tokens=leg.completion_tokens,
        )
        return cls(leg.model, leg.worker_id, usage, index, leg)


@dataclass(frozen=True)
class ServedRequest:
    """A self-hosted request (or one leg of it) waiting for its worker's intervals to close."""

    result: InferenceResult
    pool: str
    worker_id: str
    start_ms: int  # engine start (completed - engine time)
    end_ms: int  # completion
    prefill_tokens: int  # prompt tokens the engine computed (cached prefix excluded)
    decode_tokens: int
    priced: Priced | None = None  # one leg of a continued answer; None: the whole result

    @property
    def key(self) -> str:
        """Its record id: the request key, or the leg's (`leg_record_id`)."""
        return leg_record_id(self.result.request_key, self.priced.leg if self.priced is not None else None)


def booking(result: InferenceResult) -> tuple[BookedTo, str | None]:
    """Shadow copies are the experiment's cost, never the tenant's."""
    if result.shadow:
        return BookedTo.EXPERIMENT, result.experiment_id or NO_EXPERIMENT
    return BookedTo.TENANT, result.experiment_id


def base_record(
    result: InferenceResult,
    book: PriceBook,
    kind: CostKind,
    cost_micro: int,
    priced: Priced | None = None,
    **more: object,
) -> CostRecord:
    """The record of one result, or of one leg of it (`priced`); `more` sets further CostRecord fields."""
    booked_to, experiment_id = booking(result)
    what = priced or Priced.whole(result)
    usage = what.usage
    # Savings and caps are the answer's: on its own record only, never again on a leg's.
    answer = what.leg is None
    # A copy of a template with the fields set: every value is computed here from a validated
    # result, and validating again was most of the per-result CPU. All fields go in one update
    # (setting attributes afterwards goes through pydantic's slower __setattr__).
    return _TEMPLATE.model_copy(
        update=dict(
            record_id=leg_record_id(result.request_key, what.leg),  # unique across tenants: two may send one id
            request_id=result.request_id,
            tenant=result.tenant,
            model=what.model or "",
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
            worker_id=what.worker_id,
            cost_micro_usd=cost_micro,
            cost_usd=usd(cost_micro),
            prompt_tokens=usage.prompt_tokens,
            cached_prompt_tokens=usage.cached_prompt_tokens,
            completion_tokens=usage.completion_tokens,
            trimmed_prompt_tokens=result.trimmed_tokens if answer else 0,
            baseline_micro_usd=book.list_price_micro(
                book.default_model, usage.prompt_tokens + result.trimmed_tokens, 0, usage.completion_tokens
            )
            if answer
            else None,
            list_price_micro_usd=book.list_price_micro(what.model, usage.prompt_tokens, 0, usage.completion_tokens),
            output_cap_saving_micro_usd=output_cap_saving(result, book) if answer else 0,
            booked_at_ms=result.completed_at_ms,
            release=result.release,
            leg=what.leg,
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
    """What prices `result` as one answer: a record, or a ledger entry (a continued answer: `price_parts`)."""
    if result.cached:
        usage = result.usage
        saving = book.list_price_micro(result.model, usage.prompt_tokens, 0, usage.completion_tokens) or 0
        return base_record(result, book, CostKind.CACHE, 0, saving_micro_usd=saving, cached_saving_usd=usd(saving))
    return _price(result, book, Priced.whole(result))


def price_parts(result: InferenceResult, book: PriceBook) -> list[CostRecord | ServedRequest]:
    """What prices `result`: one record or ledger entry, or one per leg of a continued answer."""
    if not result.legs or result.cached:
        return [price_result(result, book)]
    last = len(result.legs) - 1
    return [_price(result, book, Priced.of_leg(leg, None if i == last else i)) for i, leg in enumerate(result.legs)]


def served_parts(result: InferenceResult, book: PriceBook) -> list[ServedRequest]:
    """The parts of `result` the GPU ledger prices (none: it is priced by tokens, or not at all)."""
    return [priced for priced in price_parts(result, book) if isinstance(priced, ServedRequest)]


def _price(result: InferenceResult, book: PriceBook, priced: Priced) -> CostRecord | ServedRequest:
    usage = priced.usage
    if priced.model in book.hosted:
        cost = book.hosted[priced.model].cost_micro(
            usage.prompt_tokens, usage.cached_prompt_tokens, usage.completion_tokens
        )
        return base_record(result, book, CostKind.HOSTED, cost, priced)
    pool = book.pool_of(priced.model, priced.worker_id)
    if pool is not None and priced.worker_id:
        start_ms, end_ms = _span_ms(result, priced)
        return ServedRequest(
            result=result,
            pool=pool,
            worker_id=priced.worker_id,
            start_ms=min(start_ms, end_ms - 1),  # at least 1 ms of GPU time
            end_ms=end_ms,
            prefill_tokens=max(0, usage.prompt_tokens - usage.cached_prompt_tokens),
            decode_tokens=usage.completion_tokens,
            priced=priced if priced.part is not None else None,
        )
    if result.status == ResultStatus.ERROR and usage.total_tokens == 0:
        return base_record(result, book, CostKind.NONE, 0, priced)
    return base_record(result, book, CostKind.UNPRICED, 0, priced)


def _span_ms(result: InferenceResult, priced: Priced) -> tuple[int, int]:
    """When the engine worked on it: the result's engine time up to its completion, or a leg's own span
    (an earlier leg read back from its chunks: its first to its last chunk)."""
    leg = priced.part
    if leg is None or priced.leg is None:  # the whole result, or its last leg, which ends with it
        end_ms = result.completed_at_ms
        if leg is not None and leg.started_at_ms is not None:
            return leg.started_at_ms, end_ms
        return end_ms - round(result.timings.engine_ms or 0.0), end_ms
    end_ms = leg.ended_at_ms or leg.started_at_ms or result.completed_at_ms
    return (leg.started_at_ms or end_ms - 1), end_ms
