"""Publishing through a broker restart (fake producers; the real broker restart is the
`broker_restart` scenario in tests/reliability):

- a late ack is waited for, never answered with a second send of the record;
- a producer whose idempotence sequence the broker refuses (aiokafka counts a batch that expired
  unsent during the outage, so every later record of that partition is refused) is replaced, and
  the record goes out on the new one;
- a record refused for what it is (too large) is not sent again; the retry time bounds the rest;
- the router rides out a failed send of a routed request, and one that cannot go out at all is
  answered (claimed first, so the routed record, if written after all, gets no second answer):
  before, the request went to the DLQ unanswered, the scenario's "lost" requests.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import (
    KafkaTimeoutError,
    LeaderNotAvailableError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
)

from llmbus.bus.producer import Publisher, PublishTimeout
from llmbus.contract.messages import ErrorCode, InferenceRequest, InferenceResult, RoutedRequest, TokenChunk
from llmbus_services.engine_worker.adapters.streaming import ReplyStream
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.pipeline import RouteOutcome
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_router_answers_once import EveryTopicExists, request_record
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher

CHUNK = TokenChunk(request_id="r1", tenant="t", seq=0, delta="hi")


class FakeProducer:
    """`send` enqueues; each delivery ends as `outcome` says: "ok", an exception, or never
    (`outcomes`, when given, says it send by send)."""

    def __init__(
        self,
        outcome: object = "ok",
        ack_after_s: float = 0.0,
        outcomes: list[object] | None = None,
        refused_enqueues: int = 0,
    ) -> None:
        self.outcome = outcome
        # aiokafka's own refusal while a partition waits for its leader: its kept batch is full, and
        # `send` fails after request_timeout_ms with nothing queued.
        self.refused_enqueues = refused_enqueues
        self.outcomes = outcomes
        self.ack_after_s = ack_after_s
        self.sent: list[bytes] = []
        self.stopped = False

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future[object]:
        if self.refused_enqueues:
            self.refused_enqueues -= 1
            raise KafkaTimeoutError()
        self.sent.append(value)
        outcome = self.outcomes.pop(0) if self.outcomes else self.outcome
        delivery: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if isinstance(outcome, BaseException):
            delivery.set_exception(outcome)
        elif outcome == "ok":
            asyncio.get_running_loop().call_later(
                self.ack_after_s, lambda: delivery.done() or delivery.set_result(None)
            )
        return delivery

    async def stop(self) -> None:
        self.stopped = True


def publisher_with(first: FakeProducer, *then: FakeProducer | BaseException, send_timeout_s: float = 0.1) -> Publisher:
    spares = list(then)

    async def renew() -> FakeProducer:
        spare = spares.pop(0)
        if isinstance(spare, BaseException):
            raise spare
        return spare

    return Publisher(first, "worker", send_timeout_s, renew=renew)  # type: ignore[arg-type]


async def test_a_late_ack_is_waited_for_and_the_record_is_not_sent_twice() -> None:
    slow = FakeProducer(ack_after_s=0.35)  # more than three send timeouts
    publisher = publisher_with(slow)
    await publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=5)
    assert len(slow.sent) == 1


async def test_a_refused_sequence_gets_a_new_producer_and_the_same_record_again() -> None:
    broken = FakeProducer(OutOfOrderSequenceNumber())
    fresh = FakeProducer()
    publisher = publisher_with(broken, fresh)
    await publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=5)
    assert broken.sent == fresh.sent == [CHUNK.to_bytes()]  # the same bytes, once on each
    assert publisher.producer is fresh
    await asyncio.sleep(0)  # the old one is stopped in the background
    assert broken.stopped


async def test_without_retries_the_error_is_raised_but_the_next_publish_works() -> None:
    broken = FakeProducer(OutOfOrderSequenceNumber())
    fresh = FakeProducer()
    publisher = publisher_with(broken, fresh)
    with pytest.raises(OutOfOrderSequenceNumber):
        await publisher.publish("llm.workers", CHUNK, key="w1")
    await publisher.publish("llm.workers", CHUNK, key="w1")
    assert fresh.sent == [CHUNK.to_bytes()]


async def test_a_chunk_sent_without_waiting_still_replaces_a_refused_producer() -> None:
    broken = FakeProducer(OutOfOrderSequenceNumber())
    fresh = FakeProducer()
    publisher = publisher_with(broken, fresh)
    delivery = await publisher.publish("llm.tokens", CHUNK, key="r1", wait=False)
    with pytest.raises(OutOfOrderSequenceNumber):
        await publisher.delivered([delivery])
    await asyncio.sleep(0.01)
    assert publisher.producer is fresh


async def test_a_stream_of_chunks_rides_out_a_leader_change_longer_than_the_request_timeout() -> None:
    """The reply topic's partition waits for its new leader: the next chunks are refused at enqueue,
    then the acks come later than several send timeouts. Each chunk is written once, in order; before,
    the refused enqueue failed the attempt, and a late ack had every chunk sent a second time."""
    leaderless = FakeProducer(ack_after_s=0.35, refused_enqueues=2)  # acks after three send timeouts
    stream = ReplyStream(publisher_with(leaderless), "llm.replies", "r1", retry_for_s=5)
    chunks = [CHUNK.model_copy(update={"seq": seq, "delta": f"d{seq}"}) for seq in range(3)]
    for chunk in chunks:
        await stream.send(chunk)
    await stream.delivered()
    assert leaderless.sent == [chunk.to_bytes() for chunk in chunks]


async def test_a_streamed_chunk_whose_producer_is_replaced_is_sent_again() -> None:
    """A record left pending by a producer replaced and stopped never resolves: the stream sends
    every chunk again on the new producer (readers drop copies by attempt and seq)."""
    stuck = FakeProducer(outcome="never")
    fresh = FakeProducer()
    publisher = publisher_with(stuck, fresh)
    stream = ReplyStream(publisher, "llm.replies", "r1", retry_for_s=5)
    await stream.send(CHUNK)
    publisher._producer = fresh  # what _replace_broken does after a refused sequence
    publisher._stopping[stuck] = asyncio.create_task(stuck.stop())  # type: ignore[arg-type]
    await asyncio.wait_for(stream.delivered(), 5)
    assert fresh.sent == [CHUNK.to_bytes()]


async def test_a_record_refused_for_what_it_is_is_not_sent_again() -> None:
    too_large = FakeProducer(MessageSizeTooLargeError())
    publisher = publisher_with(too_large)
    with pytest.raises(MessageSizeTooLargeError):
        await publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=5)
    assert len(too_large.sent) == 1


async def test_the_retry_time_bounds_the_wait_for_an_ack_that_never_comes() -> None:
    silent = FakeProducer(outcome="never")
    publisher = publisher_with(silent)
    started = time.monotonic()
    with pytest.raises(PublishTimeout):
        await publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=0.4)
    assert 0.35 < time.monotonic() - started < 2
    assert len(silent.sent) == 1  # queued in the producer all along: never sent a second time


async def test_a_new_producer_that_cannot_start_yet_is_tried_again_on_the_next_refusal() -> None:
    broken = FakeProducer(OutOfOrderSequenceNumber())
    fresh = FakeProducer()
    publisher = publisher_with(broken, TimeoutError("broker away again"), fresh)
    await publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=5)
    assert len(broken.sent) == 2 and fresh.sent == [CHUNK.to_bytes()]


async def test_a_record_left_pending_in_a_replaced_and_stopped_producer_is_sent_again() -> None:
    old = FakeProducer(outcomes=["never", OutOfOrderSequenceNumber()])
    fresh = FakeProducer()
    publisher = publisher_with(old, fresh)
    waiting = asyncio.create_task(publisher.publish("llm.results", CHUNK, key="r1", retry_for_s=5))
    await asyncio.sleep(0.01)
    with pytest.raises(OutOfOrderSequenceNumber):  # another send meets the refusal: the producer is replaced
        await publisher.publish("llm.workers", CHUNK, key="w1")
    await asyncio.wait_for(waiting, 2)  # its delivery would never resolve: sent again on the new producer
    assert fresh.sent == [CHUNK.to_bytes()] and old.stopped


class RoutesIt:
    async def route(self, request: InferenceRequest, received_at_ms: int) -> RouteOutcome:
        return RouteOutcome(routed=RoutedRequest(request=request, model="m"))

    def request_facts(self, request: InferenceRequest, route_reason: str | None = None) -> dict[str, object]:
        return RoutedRequest(request=request, model="").facts(route_reason)  # as RouterCore's, without a policy


async def test_the_router_rides_out_a_failed_send_of_a_routed_request() -> None:
    """Failing here would leave the request to the DLQ with no answer (the broker restart's loss)."""
    producer = FakeProducer(outcomes=[LeaderNotAvailableError(), "ok"])
    publisher = publisher_with(producer)
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        RoutesIt(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        fence=MemoryFence(),
        directory=EveryTopicExists(),
    )
    await handlers.on_request(request_record("r7"))
    assert len(producer.sent) == 2 and producer.sent[0] == producer.sent[1]  # the same routed record, again


class RoutedRefused(RecordingPublisher):
    async def publish(self, topic: str, value: object, **kw: object) -> None:
        if topic.endswith("llm.routed"):
            raise PublishTimeout("no ack from Kafka for x.llm.routed within 300s")
        await super().publish(topic, value, **kw)


async def test_a_routed_request_that_cannot_go_out_is_answered_and_fenced() -> None:
    publisher, fence = RoutedRefused(), MemoryFence()
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        RoutesIt(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        fence=fence,
        directory=EveryTopicExists(),
    )
    with pytest.raises(PublishTimeout):  # the record still goes to the DLQ
        await handlers.on_request(request_record("r8"))
    [result] = publisher.of(InferenceResult)
    assert result.error is not None and result.error.code == ErrorCode.INTERNAL and result.attempt == 0
    assert fence.final["default:r8"] == "done:0"
    assert not await fence.claim_final("default:r8", 1)  # the routed record, if written later, gets no second answer
