"""Publishing through a broker restart (fake producers; the real broker restart is the
`broker_restart` scenario in tests/reliability):

- a late ack is waited for, never answered with a second send of the record;
- a producer whose idempotence sequence the broker refuses (aiokafka counts a batch that expired
  unsent during the outage, so every later record of that partition is refused) is replaced, and
  the record goes out on the new one;
- a record refused for what it is (too large) is not sent again; the retry time bounds the rest.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from aiokafka.errors import MessageSizeTooLargeError, OutOfOrderSequenceNumber

from llmbus.bus.producer import Publisher, PublishTimeout
from llmbus.messages import TokenChunk

CHUNK = TokenChunk(request_id="r1", tenant="t", seq=0, delta="hi")


class FakeProducer:
    """`send` enqueues; each delivery ends as `outcome` says: "ok", an exception, or never."""

    def __init__(self, outcome: object = "ok", ack_after_s: float = 0.0) -> None:
        self.outcome = outcome
        self.ack_after_s = ack_after_s
        self.sent: list[bytes] = []
        self.stopped = False

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future[object]:
        self.sent.append(value)
        delivery: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        if isinstance(self.outcome, BaseException):
            delivery.set_exception(self.outcome)
        elif self.outcome == "ok":
            asyncio.get_running_loop().call_later(
                self.ack_after_s, lambda: delivery.done() or delivery.set_result(None)
            )
        return delivery

    async def stop(self) -> None:
        self.stopped = True


def publisher_with(first: FakeProducer, *then: FakeProducer, send_timeout_s: float = 0.1) -> Publisher:
    spares = list(then)

    async def renew() -> FakeProducer:
        return spares.pop(0)

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
    delivery = await publisher.send("llm.tokens", CHUNK, key="r1")
    with pytest.raises(OutOfOrderSequenceNumber):
        await publisher.delivered([delivery])
    await asyncio.sleep(0.01)
    assert publisher.producer is fresh


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
