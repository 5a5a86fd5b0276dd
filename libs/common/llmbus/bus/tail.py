"""Reading a topic from its end without a group: every record written after the start, nothing committed.

The one way to tail a topic (a client's or a gateway's reply topic, results a tool waits for):
group-less, so aiokafka assigns every partition and nothing is committed, and positioned at the
end before `start` returns, so nothing written after it is missed. `ReplyRouter` shares one tail
of a reply topic among every stream waiting on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from llmbus.bus.catch_up import wait_assigned
from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.security import kafka_auth
from llmbus.contract.messages import TokenChunk
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


class TopicTail:
    """Reads a topic from its end (as of `start`), group-less: sees only what comes after."""

    def __init__(self, settings: BusSettings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        # Group-less subscription: aiokafka assigns every partition of the topic itself.
        self.consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="latest",
            request_timeout_ms=settings.request_timeout_ms,
            metadata_max_age_ms=settings.metadata_max_age_ms,
            **kafka_auth(settings),
        )

    async def start(self) -> TopicTail:
        """Started and positioned at the end; if any step fails the consumer is stopped, not left open."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> TopicTail:
        await asyncio.wait_for(self.consumer.start(), self.settings.admin_timeout_s)
        try:  # positions resolved (at the end: offset reset latest), so nothing produced after start() is missed
            await wait_assigned(self.consumer, self.settings.admin_timeout_s)
        except TimeoutError:
            raise LookupError(f"topic {self.topic} has no partitions (does it exist?)") from None
        return self

    async def records(self, timeout_s: float) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (remaining := deadline - loop.time()) > 0:
            batches = await self.consumer.getmany(timeout_ms=int(min(remaining, 0.2) * 1000))
            for records in batches.values():
                for record in records:
                    yield record  # type: ignore[misc]

    async def stop(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.consumer.stop(), self.settings.stop_timeout_s)


OnBadChunk = Callable[[ConsumerRecord, BadMessage], Awaitable[None]]
OnTailLost = Callable[[BaseException], None]
TAIL_RESTART_FIRST_S = 0.5
TAIL_RESTART_MAX_S = 30.0
TAIL_STABLE_S = 60.0  # a tail that ran this long before it failed restarts at the first backoff again


class ReplyRouter:
    """One tail of a reply topic shared by every stream of a client: chunks go to their request's queue.

    A record that does not decode (a newer schema during a rolling upgrade, a stray writer) goes to
    `on_bad` and the tail goes on: one bad record must not end the only task every stream waits on.
    A tail that fails for any other reason (its consumer refused, the broker's answer broken) is
    started again, from the topic's end, with backoff (`TAIL_RESTART_FIRST_S` doubling to
    `TAIL_RESTART_MAX_S`); `live` is False meanwhile, and `on_tail_lost` hears of each failure: the
    chunks of the streams waiting then may be lost in the gap, so their owner ends them.
    """

    def __init__(
        self,
        tail: TopicTail,
        on_bad: OnBadChunk | None = None,
        on_tail_lost: OnTailLost | None = None,
        restart_first_s: float = TAIL_RESTART_FIRST_S,
        restart_max_s: float = TAIL_RESTART_MAX_S,
    ) -> None:
        self.tail = tail
        self.queues: dict[bytes, asyncio.Queue[TokenChunk]] = {}
        self.on_bad = on_bad
        self.on_tail_lost = on_tail_lost
        self.restart_first_s = restart_first_s
        self.restart_max_s = restart_max_s
        self.live = True  # the tail reads now; False from a failure until its restart
        self.restarts = 0
        self.task = asyncio.create_task(self._supervise())

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        delay_s = self.restart_first_s
        while True:
            started = loop.time()
            try:
                await self._route()
            except Exception as exc:  # any failure of the tail: restarted, never the end
                self.live = False
                log.error("the reply tail of %s failed; restarting it", self.tail.topic, exc_info=exc)
                if self.on_tail_lost is not None:
                    self.on_tail_lost(exc)
            if loop.time() - started >= TAIL_STABLE_S:
                delay_s = self.restart_first_s
            while not self.live:
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, self.restart_max_s)
                self.live = await self._restart()

    async def _restart(self) -> bool:
        await self.tail.stop()
        try:
            self.tail = await TopicTail(self.tail.settings, self.tail.topic).start()
        except Exception:  # the broker still away: the next backoff tries again
            log.warning("the reply tail of %s could not start again", self.tail.topic, exc_info=True)
            return False
        self.restarts += 1
        log.info("the reply tail of %s runs again (restart %d)", self.tail.topic, self.restarts)
        return True

    async def _route(self) -> None:
        while True:
            async for record in self.tail.records(3600):
                queue = self.queues.get(record.key)  # type: ignore[attr-defined]
                if queue is None:
                    continue
                try:
                    chunk = decode(record, TokenChunk)  # type: ignore[arg-type]
                except BadMessage as bad:
                    await self._bad(record, bad)  # type: ignore[arg-type]
                    continue
                queue.put_nowait(chunk)

    async def _bad(self, record: ConsumerRecord, bad: BadMessage) -> None:
        log.warning("undecodable chunk on %s[%d]@%d: %s", record.topic, record.partition, record.offset, bad.reason)
        if self.on_bad is None:
            return
        try:
            await self.on_bad(record, bad)
        except Exception:  # the dead letter is best effort; the tail is what every stream needs
            log.exception("could not hand on the undecodable chunk at %s@%d", record.topic, record.offset)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        await self.tail.stop()
