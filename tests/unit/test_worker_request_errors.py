"""What one request's failure does to the worker (fakes for the bus and Redis; the engines' own
classification is tested against real servers in tests/integration).

- only a dead engine restarts the engine (one request's OOM does not); a 4xx is the request's final error;
  a 429/503 hands it back with Retry-After and cools the worker down;
- an attempt superseded while it runs is aborted, and one whose final claim is refused publishes nothing;
- a dispatch sent before this worker's process started (to an earlier process under its id, which may
  have streamed part of it) is handed back, not run again as the same attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import (
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
)
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings
from llmbus.state.fencing import FirstClaim
from llmbus_services.engine_worker.adapters.engines.openai_http import upstream_error
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import EngineDead, EngineError, EngineOutput, EngineRequest, EngineStats
from llmbus_services.engine_worker.flows import WorkerHandlers


@dataclass
class RecordingPublisher:
    sent: list[tuple[str, object]] = field(default_factory=list)

    async def publish(self, topic: str, value: object, **_: object) -> None:
        self.sent.append((topic, value))

    async def delivered(self, _: object, retry_for_s: float = 0.0) -> None:
        return None

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [v for _, v in self.sent if isinstance(v, kind)]


@dataclass
class FakeBus:
    publisher: RecordingPublisher
    topics: Topics = field(default_factory=lambda: Topics("x."))
    service: str = "engine-worker"
    settings: BusSettings = field(default_factory=BusSettings)


class MemoryFence:
    """llmbus.state.fencing.RequestFence's rules on a dict (the real scripts run on Redis in tests/integration)."""

    claim_lease_ms = 30_000

    def __init__(self) -> None:
        self.final: dict[str, str] = {}
        self.fence: dict[str, int] = {}
        self.claimed: dict[str, int] = {}  # when a claim was first taken, until the result is marked done

    async def superseded(self, request_id: str, attempt: int) -> bool:
        if self.fence.get(request_id, 0) > attempt:
            return True
        return request_id in self.final and self.final[request_id] != f"pending:{attempt}"

    async def claim_final(self, request_id: str, attempt: int) -> bool:
        if await self.superseded(request_id, attempt):
            return False
        self.final[request_id] = f"pending:{attempt}"
        return True

    async def claim_first(self, request_id: str, attempt: int, now_ms: int) -> FirstClaim:
        pending_before = request_id in self.final
        if not await self.claim_final(request_id, attempt):
            return FirstClaim(claimed=False)
        if (earlier := self.claimed.get(request_id)) is not None:
            return FirstClaim(claimed=True, after_earlier=True, earlier_claim_ms=earlier)
        self.claimed[request_id] = now_ms
        return FirstClaim(claimed=True, after_earlier=pending_before)

    async def final_published(self, request_id: str, attempt: int) -> None:
        self.final[request_id] = f"done:{attempt}"
        self.claimed.pop(request_id, None)


class ScriptedEngine:
    """Streams `tokens` deltas (one per step), then raises `error` if one is given."""

    name = "scripted"
    model = "m"
    max_model_len = 8192
    max_num_seqs = 16

    def __init__(self, error: EngineError | None = None, tokens: int = 3, on_step=None) -> None:  # type: ignore[no-untyped-def]
        self.error, self.tokens, self.on_step = error, tokens, on_step
        self.calls = 0
        self.aborted: list[str] = []

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        return len(text.split())

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        return None

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.calls += 1
        for i in range(self.tokens):
            if request.request_id in self.aborted:
                yield EngineOutput("", 0, 1, i, finished=True, finish_reason="abort")
                return
            if self.on_step is not None:
                await self.on_step(i)
            yield EngineOutput(f"t{i} ", 1, 1, i + 1)
        if self.error is not None:
            raise self.error
        yield EngineOutput("", 0, 1, self.tokens, finished=True, finish_reason="stop")

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats()


def record(attempt: int = 1, request_id: str = "r1") -> ConsumerRecord:
    request = InferenceRequest(request_id=request_id, prompt="hello", max_tokens=4)
    raw = Dispatch(routed=RoutedRequest(request=request, model="m"), worker_id="w1", attempt=attempt).to_bytes()
    return ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), [])


def worker(engine: ScriptedEngine, fence: MemoryFence | None = None, **settings: object):  # type: ignore[no-untyped-def]
    publisher = RecordingPublisher()
    ws = WorkerSettings(worker_id="w1", chunk_max_tokens=1, **settings)  # type: ignore[arg-type]
    handlers = WorkerHandlers(FakeBus(publisher), ws, engine, fence or MemoryFence())  # type: ignore[arg-type]
    return handlers, publisher


async def test_a_suffix_an_engine_cannot_render_is_a_final_error_before_the_engine() -> None:
    """Fill-in-the-middle on an engine that does not advertise it (vLLM without a FIM format): a final
    invalid_request on the bus, never a completion of the prefix alone."""
    engine = ScriptedEngine()
    engine.features = frozenset({"response_format", "tools"})  # type: ignore[attr-defined]
    handlers, publisher = worker(engine)
    request = InferenceRequest(request_id="r1", prompt="def f(", suffix="\n    return x", max_tokens=4)
    raw = Dispatch(routed=RoutedRequest(request=request, model="m"), worker_id="w1", attempt=1).to_bytes()
    await handlers.on_dispatch(ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), []))
    assert engine.calls == 0
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.INVALID_REQUEST and "suffix" in result.error.message
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.FAILED


@pytest.mark.parametrize("status", [400, 404, 413, 422])
async def test_an_upstream_4xx_is_the_final_error_and_the_engine_keeps_running(status: int) -> None:
    handlers, publisher = worker(ScriptedEngine(upstream_error(status, "bad request")))
    await handlers.on_dispatch(record())
    assert not handlers.engine_failed.is_set(), "one bad request must not restart the engine"
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.INVALID_REQUEST and not result.error.retryable
    assert publisher.of(TokenChunk)[-1].final  # the client's stream ends too
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.FAILED  # final: the scheduler does not retry it


@pytest.mark.parametrize(("status", "retry_after", "cooldown_ms"), [(429, "7", 7000), (503, None, 1000)])
async def test_upstream_busy_hands_back_with_retry_after_and_cools_the_worker_down(
    status: int, retry_after: str | None, cooldown_ms: int
) -> None:
    engine = ScriptedEngine(upstream_error(status, "slow down", retry_after), tokens=0)
    handlers, publisher = worker(engine)
    await handlers.on_dispatch(record(request_id="r1"))
    assert not handlers.engine_failed.is_set()
    assert not publisher.of(InferenceResult)
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert outcome.error.retry_after_ms == cooldown_ms
    # While cooling down, the next request is handed back at once, without reaching upstream.
    await handlers.on_dispatch(record(request_id="r2"))
    assert engine.calls == 1
    second = publisher.of(DispatchOutcome)[-1]
    assert second.request_id == "r2" and second.status == OutcomeStatus.RETRYABLE
    assert second.error is not None and 0 < (second.error.retry_after_ms or 0) <= cooldown_ms


async def test_a_failed_stream_is_retried_elsewhere_without_restarting_the_engine() -> None:
    handlers, publisher = worker(ScriptedEngine(EngineError("upstream stream broke")))
    await handlers.on_dispatch(record())
    assert not handlers.engine_failed.is_set()
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and not publisher.of(InferenceResult)


async def test_one_requests_oom_is_handed_back_without_restarting_the_engine() -> None:
    """vLLM fails only the request that ran out of memory; a restart would abort every other one here."""
    from llmbus_services.engine_worker.adapters.engines.vllm_engine import classify_error

    oom = classify_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    handlers, publisher = worker(ScriptedEngine(oom))
    await handlers.on_dispatch(record())
    assert not handlers.engine_failed.is_set()
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert outcome.error.code == ErrorCode.ENGINE_OOM and not publisher.of(InferenceResult)


async def test_an_oom_that_killed_the_engine_core_restarts_it() -> None:
    handlers, publisher = worker(ScriptedEngine(EngineDead("engine core died: out of memory", ErrorCode.ENGINE_OOM)))
    await handlers.on_dispatch(record())
    assert handlers.engine_failed.is_set()
    assert publisher.of(DispatchOutcome)[0].error.code == ErrorCode.ENGINE_OOM  # type: ignore[union-attr]


async def test_an_admission_refusal_sends_the_workers_prompt_count_back() -> None:
    from llmbus_services.engine_worker.core.engine import AdmissionError

    class TooLong(ScriptedEngine):
        def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
            raise AdmissionError(f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len 2")

    handlers, publisher = worker(TooLong())
    await handlers.on_dispatch(record())
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.prompt_tokens == 1  # "hello": one word here


async def test_a_dispatch_sent_to_an_earlier_process_of_this_worker_is_handed_back() -> None:
    """Run again under the same attempt, its chunks would continue the dead process's seq numbers with
    another text; its attempt is lost with that process (worker_lost), and attempt + 1 continues what it
    streamed (docs/delivery.md)."""
    engine = ScriptedEngine()
    handlers, publisher = worker(engine)
    before = record(request_id="r-before")
    sent_ms = Dispatch.model_validate_json(before.value).dispatched_at_ms
    handlers.started_at_ms = sent_ms + 1  # this process started after it was sent
    await handlers.on_dispatch(before)
    assert engine.calls == 0 and not publisher.of(TokenChunk) and not publisher.of(InferenceResult)
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert outcome.error.code == ErrorCode.WORKER_LOST
    after = record(request_id="r-after")  # sent once this process runs: served
    handlers.started_at_ms = Dispatch.model_validate_json(after.value).dispatched_at_ms
    await handlers.on_dispatch(after)
    assert engine.calls == 1 and publisher.of(DispatchOutcome)[-1].status == OutcomeStatus.COMPLETED


async def test_a_dead_engine_is_restarted() -> None:
    handlers, publisher = worker(ScriptedEngine(EngineDead("engine core died")))
    await handlers.on_dispatch(record())
    assert handlers.engine_failed.is_set()
    assert publisher.of(DispatchOutcome)[0].status == OutcomeStatus.RETRYABLE


async def test_an_attempt_superseded_while_running_is_aborted_and_publishes_no_result() -> None:
    fence = MemoryFence()

    async def step(i: int) -> None:
        if i == 2:
            fence.fence["default:r1"] = 2  # the scheduler placed attempt 2 elsewhere (this worker looked dead)

    engine = ScriptedEngine(tokens=50, on_step=step)
    handlers, publisher = worker(engine, fence, superseded_check_s=0.0)
    await handlers.on_dispatch(record(attempt=1))
    assert engine.aborted == ["default:r1"]  # the engine knows a request by its key
    assert not publisher.of(InferenceResult) and not [c for c in publisher.of(TokenChunk) if c.final]
    assert len(publisher.of(TokenChunk)) < 10
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.DUPLICATE


async def test_only_the_attempt_that_claims_the_final_marker_publishes_the_result() -> None:
    fence = MemoryFence()
    fence.final["default:r1"] = "pending:2"  # attempt 2 claimed it while this (zombie) attempt 1 ran
    handlers, publisher = worker(ScriptedEngine(tokens=3), fence, superseded_check_s=60.0)
    handlers_check = handlers.fence.superseded
    calls = 0

    async def first_check_passes(request_id: str, attempt: int) -> bool:
        nonlocal calls
        calls += 1
        return False if calls == 1 else await handlers_check(request_id, attempt)

    handlers.fence.superseded = first_check_passes  # type: ignore[method-assign]  # it started before attempt 2 existed
    await handlers.on_dispatch(record(attempt=1))
    assert not publisher.of(InferenceResult), "a zombie attempt must not add a second result"
    assert not [c for c in publisher.of(TokenChunk) if c.final]
    assert publisher.of(DispatchOutcome)[0].status == OutcomeStatus.DUPLICATE
    assert fence.final["default:r1"] == "pending:2"


class FlakyFencePublisher(RecordingPublisher):
    """Outcomes cannot be published once (a broker blip)."""

    failed: bool = False

    async def publish(self, topic: str, value: object, **kw: object) -> None:
        if "outcomes" in topic and not self.failed:
            self.failed = True
            raise TimeoutError("outcome publish timed out")
        await super().publish(topic, value, **kw)


async def test_when_not_even_the_outcome_goes_out_the_client_still_gets_its_final_error() -> None:
    fence = MemoryFence()
    real_superseded = fence.superseded
    blips = iter([ConnectionError("redis: connection reset")])

    async def blip_once(request_id: str, attempt: int) -> bool:
        if (err := next(blips, None)) is not None:
            raise err
        return await real_superseded(request_id, attempt)

    fence.superseded = blip_once  # type: ignore[method-assign]
    publisher = FlakyFencePublisher()
    ws = WorkerSettings(worker_id="w1")  # type: ignore[call-arg]
    handlers = WorkerHandlers(FakeBus(publisher), ws, ScriptedEngine(), fence)  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):  # the record still goes to the DLQ (ConsumerLoop's on_error)
        await handlers.on_dispatch(record())
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.WORKER_ERROR and "connection reset" in result.error.message
    assert [c.final for c in publisher.of(TokenChunk)] == [True]
    assert publisher.of(DispatchOutcome)[0].status == OutcomeStatus.FAILED  # the scheduler lets it go


def test_vllm_errors_by_kind() -> None:
    from llmbus_services.engine_worker.adapters.engines.vllm_engine import classify_error
    from llmbus_services.engine_worker.core.engine import EngineOOM, RequestRejected

    class VLLMValidationError(ValueError):  # the name is what classify_error matches (vLLM imported lazily)
        pass

    class EngineDeadError(RuntimeError):
        pass

    rejected = classify_error(VLLMValidationError("max_tokens must be at least 1"))
    assert isinstance(rejected, RequestRejected) and not rejected.retryable and not rejected.restarts_engine
    assert classify_error(EngineDeadError()).restarts_engine
    assert isinstance(classify_error(RuntimeError("CUDA out of memory")), EngineOOM)
    other = classify_error(RuntimeError("sampler hiccup"))
    assert other.retryable and not other.restarts_engine
