"""Load for the pipeline benchmark: raw-JSON clients on llm.requests, a reply-topic reader, CPU windows.

The clients are what an outside Kafka client does (README: raw JSON onto llm.requests, read
the reply topic by request id): one producer, one group-less tail of the reply topic, a
dispatcher that hands each request its chunks. Chunks are read with `json.loads`, not
pydantic, so the client's own cost stays small next to the services'.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import psutil
from aiokafka import AIOKafkaProducer

from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest
from llmbus.settings import BusSettings


@dataclass
class Pending:
    sent_s: float
    first_token_s: float | None = None
    final_s: float | None = None
    error: str | None = None
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass
class Sample:
    sent_s: float
    first_token_ms: float | None
    final_ms: float | None
    error: str | None
    request_id: str = ""


class ChunkMeter:
    """Tokens and chunks received while on (between `start` and `stop`), and each chunk's delivery.

    Delivery = the client's wall clock when the reader got the record minus the record's Kafka
    timestamp (CreateTime: the worker's producer stamps it when the chunk is sent). Both clocks
    are this machine's, so the difference holds no skew.
    """

    def __init__(self) -> None:
        self.on = False
        self.tokens = 0
        self.chunks = 0
        self.delivery_ms: list[float] = []
        self.timestamp_types: set[int] = set()

    def start(self) -> None:
        self.on = True

    def stop(self) -> None:
        self.on = False

    def add(self, created_ms: int, timestamp_type: int, tokens: int, received_ms: float) -> None:
        if self.on:
            self.tokens += tokens
            self.chunks += 1
            self.delivery_ms.append(received_ms - created_ms)
            self.timestamp_types.add(timestamp_type)


class PipelineClient:
    """Sends requests and matches every final chunk to its request (counting any second one)."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.topics = t.Topics(settings.topic_prefix)
        self.pending: dict[str, Pending] = {}
        self.finals: dict[str, int] = {}  # request id → final chunks seen (exactly one is right)
        self._producer = AIOKafkaProducer(
            bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True, linger_ms=0
        )
        self._tail = TopicTail(settings, self.topics.name(t.TOKENS))
        self._reader: asyncio.Task[None] | None = None
        self.meter: ChunkMeter | None = None  # set for a streaming window: every chunk is metered

    async def start(self) -> PipelineClient:
        await asyncio.wait_for(self._producer.start(), self.settings.admin_timeout_s)
        await self._tail.start()
        self._reader = asyncio.create_task(self._read())
        return self

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self._tail.stop()
        await asyncio.wait_for(self._producer.stop(), self.settings.stop_timeout_s)

    async def _read(self) -> None:
        while True:
            async for record in self._tail.records(3600):
                chunk = json.loads(record.value)  # type: ignore[attr-defined]
                now = time.perf_counter()
                if self.meter is not None:
                    created_ms, timestamp_type = record.timestamp, record.timestamp_type  # type: ignore[attr-defined]
                    self.meter.add(created_ms, timestamp_type, chunk.get("tokens", 0), time.time() * 1000)
                rid = chunk["request_id"]
                if chunk.get("final"):
                    self.finals[rid] = self.finals.get(rid, 0) + 1
                pending = self.pending.get(rid)
                if pending is None:
                    continue
                if pending.first_token_s is None and chunk.get("delta"):
                    pending.first_token_s = now
                if chunk.get("final"):
                    pending.final_s = now
                    if chunk.get("error"):
                        pending.error = chunk["error"].get("code", "error")
                    if not pending.done.done():
                        pending.done.set_result(None)

    async def call(self, request: InferenceRequest, timeout_s: float) -> Sample:
        pending = Pending(time.perf_counter())
        self.pending[request.request_id] = pending
        try:
            delivery = await self._producer.send(
                self.topics.name(t.REQUESTS), request.to_bytes(), key=request.request_id.encode()
            )
            await asyncio.wait_for(delivery, timeout_s)
            await asyncio.wait_for(asyncio.shield(pending.done), timeout_s)
        except TimeoutError:
            pending.error = pending.error or "timeout"
        finally:
            self.pending.pop(request.request_id, None)

        def ms(at: float | None) -> float | None:
            return (at - pending.sent_s) * 1000 if at is not None else None

        return Sample(pending.sent_s, ms(pending.first_token_s), ms(pending.final_s), pending.error, request.request_id)


def _busy_s() -> float:
    """CPU-seconds the whole machine spent busy (all cores, every process) since boot."""
    times = psutil.cpu_times()
    return float(sum(times)) - times.idle - getattr(times, "iowait", 0.0)


class CpuWindow:
    """CPU seconds (user + system) of named processes between `start()` and `stop()`, and of the
    whole machine. The processes named in `with_children` count their children's CPU too (a server's
    workers)."""

    def __init__(self, pids: dict[str, int], with_children: Collection[str] = ()) -> None:
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.with_children = set(with_children)
        self._start: dict[str, float] = {}
        self._machine_start = 0.0
        self.started_s = 0.0
        self.load_before = (0.0, 0.0, 0.0)

    def _cpu(self, name: str, proc: psutil.Process) -> float:
        try:
            family = [proc, *(proc.children(recursive=True) if name in self.with_children else [])]
        except psutil.NoSuchProcess:
            return float("nan")
        total = 0.0
        for member in family:
            try:
                times = member.cpu_times()
            except psutil.NoSuchProcess:
                if member is proc:
                    return float("nan")
                continue  # a child gone meanwhile
            total += times.user + times.system
        return total

    def start(self) -> None:
        self.load_before = os.getloadavg()
        self.started_s = time.perf_counter()
        self._machine_start = _busy_s()
        self._start = {name: self._cpu(name, p) for name, p in self.procs.items()}

    def stop(self) -> dict[str, object]:
        elapsed_s = time.perf_counter() - self.started_s
        cpu_s = {name: self._cpu(name, p) - self._start[name] for name, p in self.procs.items()}
        return {
            "elapsed_s": elapsed_s,
            "cpu_s": cpu_s,
            "machine_busy_s": _busy_s() - self._machine_start,
            "loadavg": [self.load_before, os.getloadavg()],
        }


def broker_pid(bootstrap: str) -> int | None:
    """The process listening on the bootstrap address's port (the local broker's JVM), if on this machine."""
    port = int(bootstrap.rsplit(":", 1)[1])
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


async def idle(cpu: CpuWindow, window_s: float) -> dict[str, object]:
    """CPU of the processes with no requests: the fixed cost (polls, heartbeats, timers)."""
    cpu.start()
    await asyncio.sleep(window_s)
    return cpu.stop()


MakeRequest = Callable[[int], InferenceRequest]


async def closed_loop(
    client: PipelineClient,
    make_request: MakeRequest,
    concurrency: int,
    warmup_s: float,
    window_s: float,
    cpu: CpuWindow,
    timeout_s: float = 30.0,
    meter: ChunkMeter | None = None,
) -> tuple[list[Sample], dict[str, object]]:
    """`concurrency` clients, each sending its next request when the last one finished.

    Requests answered inside the window count; CPU (and chunks, with a `meter`) are read over
    the same window.
    """
    loop = asyncio.get_running_loop()
    window_start = loop.time() + warmup_s
    window_end = window_start + window_s
    counter = iter(range(10**9))
    samples: list[Sample] = []
    cpu_result: dict[str, object] = {}

    async def one_client() -> None:
        while loop.time() < window_end:
            sample = await client.call(make_request(next(counter)), timeout_s)
            if window_start <= loop.time() <= window_end:  # answered inside the window
                samples.append(sample)

    async def measure() -> None:
        await asyncio.sleep(max(0.0, window_start - loop.time()))
        cpu.start()
        if meter is not None:
            meter.start()
        await asyncio.sleep(max(0.0, window_end - loop.time()))
        if meter is not None:
            meter.stop()
        cpu_result.update(cpu.stop())

    await asyncio.gather(measure(), *[one_client() for _ in range(concurrency)])
    return samples, cpu_result


async def open_loop(
    client: PipelineClient,
    make_request: MakeRequest,
    rate_per_s: float,
    window_s: float,
    cpu: CpuWindow,
    timeout_s: float = 30.0,
) -> tuple[list[Sample], dict[str, object]]:
    """Requests at a fixed rate whatever the answers do (a replayed trace), for `window_s`."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    total = int(rate_per_s * window_s)
    calls: list[asyncio.Task[Sample]] = []
    cpu.start()
    for i in range(total):
        await asyncio.sleep(max(0.0, started + i / rate_per_s - loop.time()))
        calls.append(asyncio.create_task(client.call(make_request(i), timeout_s)))
    samples = list(await asyncio.gather(*calls))
    return samples, cpu.stop()
