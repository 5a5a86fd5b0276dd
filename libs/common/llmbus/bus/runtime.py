"""What every service process shares: one producer, the topic names, signals, /metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import uvloop
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord
from prometheus_client import start_http_server

from llmbus.bus.codec import BadMessage
from llmbus.bus.dlq import send_to_dlq
from llmbus.bus.headers import REQUEST_ID, header_value
from llmbus.bus.producer import Publisher, make_producer
from llmbus.bus.topic_directory import TopicDirectory, TopicExistence
from llmbus.contract.messages import ErrorCode
from llmbus.contract.topics import Topics
from llmbus.observability.profiling import cpu_profiled
from llmbus.observability.telemetry import setup_logging, setup_tracing
from llmbus.process.heap import tune_for_service
from llmbus.settings import BusSettings

log = logging.getLogger(__name__)


@dataclass
class Bus:
    """The connection bundle a service's handlers are given."""

    settings: BusSettings
    service: str
    topics: Topics
    publisher: Publisher
    directory: TopicExistence = None  # type: ignore[assignment]  # set below: which topics exist
    client_suffix: str = ""  # in every client id of the process (`-w1`: which worker's consumers these are)

    def __post_init__(self) -> None:
        if self.directory is None:
            self.directory = TopicDirectory(lambda: self.publisher.producer, self.settings.admin_timeout_s)

    @classmethod
    async def start(cls, settings: BusSettings, service: str, client_suffix: str = "") -> Bus:
        async def new_producer() -> AIOKafkaProducer:
            producer = make_producer(settings, client_id=f"llmbus-{service}{client_suffix}")
            await asyncio.wait_for(producer.start(), settings.admin_timeout_s)
            return producer

        # The publisher starts a new producer when the broker refuses the old one's sequence.
        publisher = Publisher(await new_producer(), service, settings.send_timeout_s, renew=new_producer)
        return cls(settings, service, Topics(settings.topic_prefix), publisher, client_suffix=client_suffix)

    @property
    def producer(self) -> AIOKafkaProducer:
        """The producer in use now (the publisher may have replaced the first one)."""
        return self.publisher.producer

    async def stop(self) -> None:
        await self.publisher.close(self.settings.stop_timeout_s)

    async def send_dead_letter(
        self, record: ConsumerRecord, code: str, reason: str, request_id: str | None = None
    ) -> bool:
        """The record to llm.dlq, bounded and retried as settings say; False if it had to be skipped."""
        return await send_to_dlq(
            self.publisher,
            self.topics,
            record,
            code,
            reason,
            self.service,
            request_id,
            max_payload_bytes=self.settings.dlq_max_payload_bytes,
            retry_s=self.settings.dlq_retry_s,
        )

    async def dead_letter(self, record: ConsumerRecord, exc: Exception) -> None:
        """Default `on_error` of a ConsumerLoop: the DLQ, with the reason."""
        if isinstance(exc, BadMessage):
            await self.send_dead_letter(record, exc.code, exc.reason, exc.request_id)
        else:
            log.exception("handler failed on %s[%d]@%d", record.topic, record.partition, record.offset, exc_info=exc)
            # The record decoded (it was handled): its request id header says which request it was.
            request_id = header_value(record.headers, REQUEST_ID)
            await self.send_dead_letter(record, ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", request_id)


ServiceMain = Callable[[BusSettings, asyncio.Event], Awaitable[None]]


def run_service(service: str, main: ServiceMain, settings: BusSettings | None = None) -> None:
    """Run a service until SIGTERM/SIGINT; `main` returns after `stop` is set and work is drained."""
    settings = settings or BusSettings()
    tune_for_service()
    setup_logging(service, settings.log_level, settings.log_json)
    setup_tracing(service, settings)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, addr=settings.metrics_host)

    async def _run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(settings, stop)

    # uvloop: the event loop's own cost (socket writes, polling, callbacks) is most of a service's
    # CPU per message (bench/reports/pipeline.md); libuv's is a fraction of asyncio's pure-Python one.
    with cpu_profiled(settings.cpu_profile, service), asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(_run())
