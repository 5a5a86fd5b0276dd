"""A worker's answer through a broker restart (fakes for the bus and Redis):

- a result whose publish times out is never followed by a second, different result, nor handed
  back for another attempt (either would answer the request twice once the first is written);
- the claim on the result is kept alive while the result is being published;
- chunks the broker did not acknowledge are sent again before the result, so the stream is whole.
"""

from __future__ import annotations

import asyncio

from llmbus.bus import PublishTimeout
from llmbus.contract.messages import DispatchOutcome, InferenceResult, OutcomeStatus, ResultStatus, TokenChunk
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.flows import WorkerHandlers
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher, ScriptedEngine, record


class ResultNeverAcked(RecordingPublisher):
    """The result's publish gives up (the broker stayed away past its retry time)."""

    async def publish(self, topic: str, value: object, **kw: object) -> None:
        await super().publish(topic, value, **kw)
        if isinstance(value, InferenceResult):
            raise PublishTimeout("no ack from Kafka for x.llm.results within 300s")


def worker_with(publisher: RecordingPublisher, fence: MemoryFence) -> WorkerHandlers:
    ws = WorkerSettings(worker_id="w1", chunk_max_tokens=1)  # type: ignore[call-arg]
    return WorkerHandlers(FakeBus(publisher), ws, ScriptedEngine(tokens=3), fence)  # type: ignore[arg-type]


async def test_a_result_whose_publish_timed_out_is_not_followed_by_another_answer() -> None:
    publisher, fence = ResultNeverAcked(), MemoryFence()
    await worker_with(publisher, fence).on_dispatch(record())  # handled: nothing for the DLQ either
    [result] = publisher.of(InferenceResult)  # the one attempted: no error result after it
    assert result.status == ResultStatus.OK
    retryable = [o for o in publisher.of(DispatchOutcome) if o.status == OutcomeStatus.RETRYABLE]
    assert not retryable, "handing it back would place another attempt: a second result"
    assert fence.final["default:r1"] == "pending:1"  # the claim stays with this attempt


class SlowResult(RecordingPublisher):
    """The result's ack takes longer than the claim's lease (the broker restarts meanwhile)."""

    async def publish(self, topic: str, value: object, **kw: object) -> None:
        if isinstance(value, InferenceResult):
            await asyncio.sleep(0.5)
        await super().publish(topic, value, **kw)


class CountingFence(MemoryFence):
    claim_lease_ms = 150

    def __init__(self) -> None:
        super().__init__()
        self.claims = 0

    async def claim_final(self, request_id: str, attempt: int) -> bool:
        self.claims += 1
        return await super().claim_final(request_id, attempt)


async def test_the_claim_is_renewed_while_the_result_is_being_published() -> None:
    publisher, fence = SlowResult(), CountingFence()
    await worker_with(publisher, fence).on_dispatch(record())
    assert fence.claims >= 1 + 3, "0.5 s of publishing with a 150 ms lease: renewed every 50 ms"
    assert fence.final["default:r1"] == "done:1"
    assert len(publisher.of(InferenceResult)) == 1


class ChunksLost(RecordingPublisher):
    """The chunks' acks never came (their batch expired while the broker was down)."""

    failed = False

    async def delivered(self, deliveries: object, retry_for_s: float = 0.0) -> None:
        if not self.failed:
            self.failed = True
            raise PublishTimeout("no ack from Kafka for 3 records within 15.0s")


async def test_unacknowledged_chunks_are_sent_again_before_the_result() -> None:
    publisher = ChunksLost()
    await worker_with(publisher, MemoryFence()).on_dispatch(record())
    chunks = publisher.of(TokenChunk)
    content = [c.seq for c in chunks if not c.final]
    assert content == [0, 1, 2, 0, 1, 2]  # sent, then sent again whole and in order
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.OK and result.text == "t0 t1 t2 "
    assert [c.seq for c in chunks if c.final] == [3]
    assert publisher.of(DispatchOutcome)[0].status == OutcomeStatus.COMPLETED
