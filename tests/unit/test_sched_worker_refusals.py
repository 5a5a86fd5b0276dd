"""How the scheduler ends what a worker could not run: an OOM is retried once at most, and only on a worker
with more free KV than the one it failed on; a prompt the worker counted too long for every worker is final."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import ErrorCode, ErrorInfo, OutcomeStatus
from llmbus.contract.request_key import request_key
from llmbus_services.scheduler.core.pipeline import Pipeline
from llmbus_services.scheduler.core.scheduler import CoreConfig, FinalError, PlaceAction, SchedulerCore
from tests.unit.test_sched_filters import NOW_MS, hb, req

OOM = ErrorInfo.of(ErrorCode.ENGINE_OOM, "CUDA out of memory")


def _core(pipeline: str = "default") -> SchedulerCore:
    return SchedulerCore(Pipeline.load(pipeline), CoreConfig(seed=0, max_attempts=3))


@pytest.mark.parametrize("pipeline", ["default", "round-robin", "least-loaded"])
def test_oom_retry_goes_to_a_worker_with_more_free_kv_and_a_second_oom_is_final(pipeline: str) -> None:
    c = _core(pipeline)
    c.on_heartbeat(hb("small", kv_blocks_free=40), NOW_MS)
    [first] = c.submit(req(request_id="r1", prompt_tokens=200, max_tokens=200), NOW_MS)
    assert isinstance(first, PlaceAction) and first.placement.worker_id == "small"  # where it runs out of memory
    c.on_heartbeat(hb("same", kv_blocks_free=40), NOW_MS)
    c.on_heartbeat(hb("big", kv_blocks_free=900, num_requests_running=7), NOW_MS)  # busier: scorers prefer "same"
    [retry] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 10)
    assert isinstance(retry, PlaceAction) and retry.placement.worker_id == "big"
    assert retry.placement.attempt == 2
    [final] = c.on_outcome(request_key("default", "r1"), 2, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 20)
    assert isinstance(final, FinalError)
    assert final.error.code == ErrorCode.ENGINE_OOM and not final.error.retryable, "not max_attempts, not a 3rd try"


def test_oom_retry_waits_until_a_worker_has_more_free_kv() -> None:
    c = _core()
    c.on_heartbeat(hb("w1", kv_blocks_free=100), NOW_MS)
    c.on_heartbeat(hb("w2", kv_blocks_free=60), NOW_MS)
    [placed] = c.submit(req(request_id="r1", prompt_tokens=200, max_tokens=200), NOW_MS)
    assert isinstance(placed, PlaceAction) and placed.placement.worker_id == "w1"
    assert (
        c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 10) == []
    )  # w2 has less: it waits
    assert request_key("default", "r1") in c.queues.of("m")
    [later] = c.on_heartbeat(hb("w2", kv_blocks_free=700, sent_at_ms=NOW_MS + 50), NOW_MS + 50)
    assert isinstance(later, PlaceAction) and later.placement.worker_id == "w2"


def test_oom_with_no_worker_that_could_ever_have_more_free_kv_is_final_at_once() -> None:
    c = _core()
    c.on_heartbeat(hb("w1", kv_blocks_total=100, kv_blocks_free=100), NOW_MS)
    c.on_heartbeat(hb("w2", kv_blocks_total=100, kv_blocks_free=90), NOW_MS)
    [placed] = c.submit(req(request_id="r1", prompt_tokens=200, max_tokens=200), NOW_MS)
    assert isinstance(placed, PlaceAction)
    [final] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 10)
    assert isinstance(final, FinalError) and final.error.code == ErrorCode.ENGINE_OOM
    assert not final.error.retryable


def test_a_worker_count_over_every_max_model_len_is_a_final_prompt_too_long_not_a_retry() -> None:
    """The router estimated 5,000 tokens; the worker's tokenizer found 6,200: 6,200 + 3,000 fit no worker."""
    c = _core()
    c.on_heartbeat(hb("w1"), NOW_MS)
    c.on_heartbeat(hb("w2"), NOW_MS)
    [placed] = c.submit(req(request_id="r1", prompt_tokens=5000, max_tokens=3000), NOW_MS)
    assert isinstance(placed, PlaceAction)
    refused = ErrorInfo.of(ErrorCode.OVER_CAPACITY, "prompt 6200 + max_tokens 3000 > max_model_len 8192")
    [final] = c.on_outcome(
        request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, refused, NOW_MS + 10, prompt_tokens=6200
    )
    assert isinstance(final, FinalError)
    assert final.error.code == ErrorCode.PROMPT_TOO_LONG and not final.error.retryable


def test_a_worker_count_that_a_longer_worker_fits_is_retried_there() -> None:
    c = _core()
    c.on_heartbeat(hb("w1"), NOW_MS)
    [placed] = c.submit(req(request_id="r1", prompt_tokens=5000, max_tokens=3000), NOW_MS)
    assert isinstance(placed, PlaceAction)
    c.on_heartbeat(hb("long", max_model_len=32768), NOW_MS)
    refused = ErrorInfo.of(ErrorCode.OVER_CAPACITY, "too long here")
    [retry] = c.on_outcome(
        request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, refused, NOW_MS + 10, prompt_tokens=6200
    )
    assert isinstance(retry, PlaceAction) and retry.placement.worker_id == "long"
    assert retry.request.prompt_tokens == 6200


def test_an_oom_on_a_worker_that_reports_no_kv_cache_is_retried_once_elsewhere() -> None:
    c = _core()
    c.on_heartbeat(hb("w1", kv_blocks_total=0, kv_blocks_free=0), NOW_MS)
    [placed] = c.submit(req(request_id="r1"), NOW_MS)
    assert isinstance(placed, PlaceAction)
    c.on_heartbeat(hb("w2", kv_blocks_total=0, kv_blocks_free=0), NOW_MS)
    [retry] = c.on_outcome(request_key("default", "r1"), 1, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 10)
    assert isinstance(retry, PlaceAction) and retry.placement.worker_id == "w2"
    [final] = c.on_outcome(request_key("default", "r1"), 2, OutcomeStatus.RETRYABLE, OOM, NOW_MS + 20)
    assert isinstance(final, FinalError) and final.error.code == ErrorCode.ENGINE_OOM
