"""What /v1/models lists: models declared on llm.models and models the fleet serves (llm.workers)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from llmbus.bus import BadMessage, decode, make_consumer, stop_consumer
from llmbus.bus.catch_up import assigned_ends, reached
from llmbus.contract import topics as t
from llmbus.contract.messages import ModelSpec, WorkerState, WorkerStatus, now_ms
from llmbus.settings import BusSettings

DeadLetter = Callable[[ConsumerRecord, Exception], Awaitable[None]]
log = logging.getLogger(__name__)


class ModelCatalog:
    """The latest model specs and worker heartbeats (pure: fed by `CatalogFollower`)."""

    def __init__(self, worker_stale_s: float) -> None:
        self.specs: dict[str, ModelSpec] = {}
        self.workers: dict[str, WorkerStatus] = {}
        self.stale_ms = worker_stale_s * 1000

    def knows(self, model: str) -> bool:
        """Declared, or served by some worker we have heard of (a dead one's model is 503, not 404)."""
        return model in self.specs or any(model in w.models for w in self.workers.values())

    def _live(self, at_ms: int) -> list[WorkerStatus]:
        return [
            w for w in self.workers.values() if w.state != WorkerState.STOPPED and at_ms - w.sent_at_ms <= self.stale_ms
        ]

    def serving(self, model: str, at_ms: int | None = None) -> list[WorkerStatus]:
        """The last heartbeats of the live workers serving `model`."""
        return [w for w in self._live(now_ms() if at_ms is None else at_ms) if model in w.models]

    def listing(self, at_ms: int | None = None) -> list[dict[str, object]]:
        live = self._live(now_ms() if at_ms is None else at_ms)
        names = sorted(set(self.specs) | {m for w in live for m in w.models})
        out = []
        for name in names:
            spec = self.specs.get(name)
            serving = [w for w in live if name in w.models]
            out.append(
                {
                    "id": name,
                    "object": "model",
                    "created": min((w.started_at_ms for w in serving), default=0) // 1000,
                    "owned_by": "llmbus",
                    "llmbus": {
                        "version": spec.version if spec else None,
                        "tier": spec.tier if spec else None,
                        "max_model_len": spec.max_model_len
                        if spec
                        else max((w.max_model_len for w in serving), default=0),
                        "workers_ready": sum(1 for w in serving if w.state == WorkerState.READY),
                    },
                }
            )
        return out


class CatalogFollower:
    """Reads llm.models and llm.workers from the beginning, then follows them."""

    def __init__(self, settings: BusSettings, catalog: ModelCatalog, dead_letter: DeadLetter) -> None:
        topics = t.Topics(settings.topic_prefix)
        self.settings = settings
        self.catalog = catalog
        self.models_topic, self.workers_topic = topics.name(t.MODELS), topics.name(t.WORKERS)
        self.consumer: AIOKafkaConsumer = make_consumer(
            settings, self.models_topic, self.workers_topic, group_id=None, client_id="llmbus-gateway-catalog"
        )
        self.dead_letter = dead_letter
        self.caught_up = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            await asyncio.wait_for(self.consumer.start(), self.settings.admin_timeout_s)
        except BaseException:  # not left open: the caller may not call stop() on a follower that never started
            await stop_consumer(self.consumer, self.settings.stop_timeout_s)
            raise
        self.task = asyncio.create_task(self._follow())

    async def _apply(self, record: ConsumerRecord) -> None:
        try:
            if record.topic == self.models_topic:
                spec = decode(record, ModelSpec)
                self.catalog.specs[spec.name] = spec
            else:
                status = decode(record, WorkerStatus)
                self.catalog.workers[status.worker_id] = status
        except BadMessage as exc:  # the catalog goes on without it; llm.dlq says why (bounded, never fatal)
            await self.dead_letter(record, exc)

    async def _follow(self) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:  # the catalog is the gateway's whole view: keep asking, but say so when it is slow
            try:
                ends = await assigned_ends(self.consumer, self.settings.admin_timeout_s)
                break
            except TimeoutError as exc:
                log.warning("model catalog: %s; still waiting", exc)
        while True:
            batches = await self.consumer.getmany(timeout_ms=self.settings.poll_timeout_ms)
            for records in batches.values():
                for record in records:
                    if record.value is not None:
                        await self._apply(record)
            if not self.caught_up.is_set() and await reached(self.consumer, ends, self.settings.admin_timeout_s):
                self.caught_up.set()
                log.info("model catalog caught up in %.2fs", loop.time() - started)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await stop_consumer(self.consumer, self.settings.stop_timeout_s)
