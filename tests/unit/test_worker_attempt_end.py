"""How a worker's attempt ends on the bus (services/engine_worker/adapters/ending.py, llmbus.bus.replies), with fakes:

- the order the rules ask for, in fewer round trips: the claim before any final record, every
  content chunk acknowledged before the final chunk, the final chunk enqueued beside the result,
  the outcome and the `done` marker after the result;
- chunks that cannot be delivered hand the request back with nothing final written;
- the outcome goes out even when the `done` marker cannot be set;
- publish_result_with_final on a Publisher over a fake producer: one produce request for the final
  chunk and the result, a final chunk that failed sent again after the result, a refusing reply
  topic logged, a result that may or may not be out raised;
- Publisher.delivered does not wait for deliveries already resolved; claim_kept starts no renewal
  for a publish shorter than a third of the lease.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import LeaderNotAvailableError, MessageSizeTooLargeError, TopicAuthorizationFailedError

from llmbus.bus import PublishTimeout
from llmbus.bus.replies import REPLY_FAILURES, publish_result_with_final
from llmbus.contract.messages import DispatchOutcome, InferenceResult, OutcomeStatus, ResultStatus, TokenChunk
from llmbus.contract.topics import Topics
from llmbus.state.fencing import claim_kept
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.flows import WorkerHandlers
from tests.unit.test_publish_through_outage import FakeProducer, publisher_with
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher, ScriptedEngine, record
from tests.unit.test_worker_result_through_outage import CountingFence


def kind(value: object) -> str:
    if isinstance(value, TokenChunk):
        return "final chunk" if value.final else f"chunk {value.seq}"
    return type(value).__name__


class EventLog(RecordingPublisher):
    """Every step in one list: enqueued records, waits for acks, publishes."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def delivered(self, deliveries: object, retry_for_s: float = 0.0) -> None:
        self.events.append("acks awaited")

    async def publish(self, topic: str, value: object, wait: bool = True, **kw: object) -> None:
        self.events.append(f"{'publish' if wait else 'enqueue'} {kind(value)}")
        await super().publish(topic, value, **kw)


class LoggedFence(MemoryFence):
    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    async def claim_final(self, request_id: str, attempt: int) -> bool:
        self.events.append("claim")
        return await super().claim_final(request_id, attempt)

    async def final_published(self, request_id: str, attempt: int) -> None:
        self.events.append("done marker")
        await super().final_published(request_id, attempt)


def worker_with(publisher: RecordingPublisher, fence: MemoryFence, tokens: int = 3) -> WorkerHandlers:
    ws = WorkerSettings(worker_id="w1", chunk_max_tokens=2)  # type: ignore[call-arg]
    return WorkerHandlers(FakeBus(publisher), ws, ScriptedEngine(tokens=tokens), fence)  # type: ignore[arg-type]


async def test_a_completed_attempt_ends_in_the_order_the_rules_ask_for() -> None:
    events: list[str] = []
    publisher = EventLog(events)
    await worker_with(publisher, LoggedFence(events)).on_dispatch(record())
    assert events == [
        "enqueue chunk 0",  # the first token at once (TTFT)
        "enqueue chunk 1",  # t1 t2: chunk_max_tokens
        "claim",  # taken while chunks 0-1 are in flight: it gates only the final records
        "acks awaited",  # every content chunk acknowledged before the final chunk follows them
        "enqueue final chunk",  # beside the result: one produce request
        "publish InferenceResult",  # decides success; waited for
        "acks awaited",  # the final chunk's (in by now)
        "enqueue DispatchOutcome",  # after the result, with the done marker set meanwhile
        "done marker",
        "acks awaited",
    ]
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.OK and result.text == "t0 t1 t2 "
    assert [(c.seq, c.final) for c in publisher.of(TokenChunk)] == [(0, False), (1, False), (2, True)]
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.COMPLETED and outcome.completion_tokens == 3
    # the latency the result reports travels on the outcome: the scheduler's TTFT statistics are made of it
    assert result.timings.ttft_ms is not None and result.timings.tpot_ms is not None
    assert (outcome.ttft_ms, outcome.tpot_ms) == (result.timings.ttft_ms, result.timings.tpot_ms)


class ReplyTopicRefuses(RecordingPublisher):
    async def delivered(self, deliveries: object, retry_for_s: float = 0.0) -> None:
        raise TopicAuthorizationFailedError("x.llm.tokens")


async def test_chunks_that_cannot_be_delivered_hand_the_request_back_with_nothing_final() -> None:
    publisher, fence = ReplyTopicRefuses(), MemoryFence()
    await worker_with(publisher, fence).on_dispatch(record())
    assert not publisher.of(InferenceResult) and not [c for c in publisher.of(TokenChunk) if c.final]
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE  # placed again once the pending claim's lease lapses
    assert fence.final["default:r1"] == "pending:1"


class MarkerNeverSet(MemoryFence):
    claim_lease_ms = 50

    async def final_published(self, request_id: str, attempt: int) -> None:
        raise ConnectionError("redis is away")


async def test_the_outcome_goes_out_even_when_the_done_marker_cannot_be_set() -> None:
    publisher = RecordingPublisher()
    await worker_with(publisher, MarkerNeverSet()).on_dispatch(record())  # ResultOut: logged, not retried
    assert len(publisher.of(InferenceResult)) == 1
    assert [o.status for o in publisher.of(DispatchOutcome)] == [OutcomeStatus.COMPLETED]


# ---- publish_result_with_final on the real Publisher --------------------------------

RESULT = InferenceResult(request_id="r1", tenant="t", status=ResultStatus.OK, text="hi", attempt=1)
TOPICS = Topics("x.")


def final_of(raw: bytes) -> TokenChunk:
    return TokenChunk.model_validate_json(raw)


async def test_the_final_chunk_is_enqueued_beside_the_result_and_each_goes_once() -> None:
    producer = FakeProducer(ack_after_s=0.01)
    await publish_result_with_final(publisher_with(producer), TOPICS, RESULT, "x.llm.tokens", last_seq=4)
    final, result = producer.sent
    assert final_of(final).final and final_of(final).seq == 5  # enqueued first, not after the result's ack
    assert InferenceResult.model_validate_json(result) == RESULT


async def test_a_final_chunk_that_failed_is_sent_again_after_the_result() -> None:
    producer = FakeProducer(outcomes=[LeaderNotAvailableError(), "ok", "ok"])
    await publish_result_with_final(publisher_with(producer), TOPICS, RESULT, "x.llm.tokens", last_seq=0, retry_for_s=5)
    assert len(producer.sent) == 3 and producer.sent[0] == producer.sent[2]  # the same final chunk, again


async def test_a_reply_topic_that_refuses_the_final_chunk_is_logged_not_raised() -> None:
    producer = FakeProducer(outcomes=[MessageSizeTooLargeError(), "ok"])
    before = REPLY_FAILURES._value.get()
    await publish_result_with_final(publisher_with(producer), TOPICS, RESULT, "x.llm.tokens", last_seq=0, retry_for_s=5)
    assert len(producer.sent) == 2  # not sent again: it would fail again
    assert REPLY_FAILURES._value.get() == before + 1


async def test_a_result_that_may_or_may_not_be_out_is_raised() -> None:
    producer = FakeProducer(outcomes=["ok", "never"])
    with pytest.raises(PublishTimeout):
        await publish_result_with_final(
            publisher_with(producer), TOPICS, RESULT, "x.llm.tokens", last_seq=0, retry_for_s=0.3
        )


# ---- small waits not taken ------------------------------------------------------------


async def test_deliveries_already_resolved_are_not_waited_for() -> None:
    publisher = publisher_with(FakeProducer())
    loop = asyncio.get_running_loop()
    ok, failed = loop.create_future(), loop.create_future()
    ok.set_result(None)
    failed.set_exception(LeaderNotAvailableError())
    done = publisher.delivered([ok, ok])
    with pytest.raises(StopIteration):
        done.send(None)  # finished at once: never suspended
    with pytest.raises(LeaderNotAvailableError):
        await publisher.delivered([ok, failed])


def renewal_tasks() -> list[asyncio.Task[object]]:
    """The claims' renewal tasks still alive (the loop is shared: other tests' tasks do not count)."""
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__.endswith("._renew")]  # type: ignore[union-attr]


async def test_a_claim_kept_over_a_short_publish_starts_no_renewal() -> None:
    fence = CountingFence()
    async with claim_kept(fence, "r1", 1):
        await asyncio.sleep(0.01)
        assert not renewal_tasks()
    assert fence.claims == 0
    async with claim_kept(fence, "r1", 1):
        await asyncio.sleep(0.13)  # past a third of the lease: renewed
        assert renewal_tasks()
    assert fence.claims >= 2 and not renewal_tasks()  # no renewal task left behind
