"""A hosted upstream that did not answer: the scheduler tries another worker of the model, else the route's
next model at once (the one whose window fits, for a prompt over the window), else the final error with its
retry hint; the next model's attempts are numbered past every earlier one, and count anew."""

from __future__ import annotations

from llmbus.contract.messages import ErrorCode, ErrorInfo, InferenceRequest, OutcomeStatus, RoutedRequest
from llmbus.contract.request_key import request_key
from llmbus.domain.fallback import fall_back
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.recovery import GiveUp, RecoveryPolicy, Retry
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from llmbus_services.scheduler.core.types import Placement, SchedRequest
from tests.unit.test_sched_filters import NOW_MS, hb

PRIMARY, FALLBACK = "gpt-4.1-mini", "llama-3.3-70b-instruct"
KEY = request_key("default", "r1")


def hosted(worker_id: str, model: str = PRIMARY, window: int = 128_000) -> object:
    return hb(worker_id, engine="openai-http", models=[model], max_model_len=window, kv_blocks_total=0)


def core(*workers: object) -> SchedulerCore:
    c = SchedulerCore(Pipeline.load("default"), CoreConfig(seed=0, heartbeat_timeout_ms=1_000))
    c.tick(NOW_MS)
    for worker in workers:
        c.on_heartbeat(worker, NOW_MS)  # type: ignore[arg-type]
    return c


def routed(chain: list[str], prompt_tokens: int = 50, attempts_before: int = 0) -> RoutedRequest:
    request = InferenceRequest(request_id="r1", prompt="hi " * 10, max_tokens=20)
    return RoutedRequest(
        request=request,
        model=PRIMARY,
        fallback_chain=chain,
        prompt_tokens_est=prompt_tokens,
        attempts_before=attempts_before,
    )


def place(c: SchedulerCore, chain: list[str], now_ms: int = NOW_MS) -> PlaceAction:
    [placed] = c.submit(SchedRequest.from_routed(routed(chain), now_ms, 16, 64), now_ms)
    assert isinstance(placed, PlaceAction)
    return placed


FAILED = ErrorInfo(code=ErrorCode.MODEL_UNAVAILABLE, message="upstream HTTP 500", retryable=True)


def test_another_worker_of_the_model_is_tried_first() -> None:
    c = core(hosted("h1"), hosted("h2"))
    first = place(c, [FALLBACK])
    [again] = c.on_outcome(KEY, 1, OutcomeStatus.RETRYABLE, FAILED, NOW_MS + 10)
    assert isinstance(again, PlaceAction) and again.placement.attempt == 2
    assert again.placement.worker_id != first.placement.worker_id


def test_with_no_other_worker_the_request_ends_here_at_once_for_the_chain_to_take() -> None:
    c = core(hosted("h1"), hosted("f1", FALLBACK))
    place(c, [FALLBACK])
    [final] = c.on_outcome(KEY, 1, OutcomeStatus.RETRYABLE, FAILED, NOW_MS + 10)
    assert isinstance(final, FinalError) and final.error == FAILED  # not max_attempts: the flow falls back
    assert final.request.attempt == 1
    hop = fall_back(final.request.routed, PRIMARY, final.error.code, attempts=1)  # type: ignore[arg-type]
    assert hop is not None and (hop.model, hop.attempts_before) == (FALLBACK, 1)
    assert hop.route_reason == f"fallback:{PRIMARY}->{FALLBACK}:model_unavailable"


def test_busy_past_the_wait_cools_the_worker_and_new_requests_fall_back_at_once() -> None:
    c = core(hosted("h1"), hosted("f1", FALLBACK))
    place(c, [FALLBACK])
    busy = ErrorInfo(code=ErrorCode.OVER_CAPACITY, message="429", retryable=True, retry_after_ms=30_000)
    [final] = c.on_outcome(KEY, 1, OutcomeStatus.RETRYABLE, busy, NOW_MS + 10)
    assert isinstance(final, FinalError) and final.error.retry_after_ms == 30_000
    assert c.fleet.workers["h1"].cooldown_until_ms == NOW_MS + 30_010
    later = NOW_MS + 1_001  # the fleet is known
    c.on_heartbeat(hosted("h1"), later)  # type: ignore[arg-type]
    c.on_heartbeat(hosted("f1", FALLBACK), later)  # type: ignore[arg-type]
    request = SchedRequest.from_routed(routed([FALLBACK]).model_copy(update={}), later, 16, 64)
    request.request_id = "r2"
    [now] = c.submit(request, later)
    # Its only worker cools down for 30 s: unavailable now, so the chain's next model answers it.
    assert isinstance(now, FinalError) and now.error.code == ErrorCode.MODEL_UNAVAILABLE


def test_a_kv_refusal_without_a_retry_hint_keeps_its_retries() -> None:
    c = core(hosted("h1"))
    place(c, [FALLBACK])
    full = ErrorInfo.of(ErrorCode.OVER_CAPACITY, "no free KV blocks")
    [again] = c.on_outcome(KEY, 1, OutcomeStatus.RETRYABLE, full, NOW_MS + 10)
    assert isinstance(again, PlaceAction) and again.placement.attempt == 2  # its KV frees up: not a fallback


def test_a_prompt_over_the_upstreams_window_ends_here_and_falls_back_to_a_model_whose_window_fits() -> None:
    c = core(hosted("h1"), hosted("small", "small", 8_192), hosted("big", "big", 32_768))
    place(c, ["small", "big"])
    too_long = ErrorInfo(code=ErrorCode.PROMPT_TOO_LONG, message="context_length_exceeded", retryable=True)
    [final] = c.on_outcome(KEY, 1, OutcomeStatus.RETRYABLE, too_long, NOW_MS + 10, prompt_tokens=9_000)
    assert isinstance(final, FinalError) and final.error.code == ErrorCode.PROMPT_TOO_LONG
    assert final.request.prompt_tokens == 9_000  # the upstream's count
    fits = [m for m in ("small", "big") if c.fits_model(final.request, m)]
    assert fits == ["big"]
    hop = fall_back(final.request.routed, PRIMARY, final.error.code, lambda m: c.fits_model(final.request, m))  # type: ignore[arg-type]
    assert hop is not None and hop.model == "big" and hop.fallback_chain == []
    # Nothing fits: no hop, the request ends prompt_too_long.
    final.request.prompt_tokens = 40_000
    assert fall_back(final.request.routed, PRIMARY, final.error.code, lambda m: c.fits_model(final.request, m)) is None  # type: ignore[arg-type]


def test_a_fallbacks_attempts_start_past_the_earlier_models_and_count_anew() -> None:
    request = SchedRequest.from_routed(routed([], attempts_before=3), NOW_MS, 16, 64)
    assert (request.attempt, request.attempts_here) == (4, 1)
    policy = RecoveryPolicy(max_attempts=2)
    failed = ErrorInfo.of(ErrorCode.ENGINE_FAILED, "broke")
    decision = policy.on_outcome(Placement("r1", 4, "w1", "m", 1, NOW_MS, request), OutcomeStatus.RETRYABLE, failed)
    assert isinstance(decision, Retry) and decision.request.attempt == 5
    last = policy.on_outcome(
        Placement("r1", 5, "w2", "m", 1, NOW_MS, decision.request), OutcomeStatus.RETRYABLE, failed
    )
    assert isinstance(last, GiveUp) and last.error.code == ErrorCode.MAX_ATTEMPTS
