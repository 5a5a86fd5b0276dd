"""Cost-accounting wiring: four declared subscriptions (llmbus.contract.contracts.COST), Redis, the ledger timer.

llm.results is read in batches (one fetch per call, up to `batch_max_records`) and committed after
the batch is billed; a record that does not decode goes to llm.dlq with its partition and offset
from inside the handler, so one bad record never blocks a partition. Every subscription is at
least once (llmbus.bus.service): a Redis or Kafka failure while a record or batch is handled is
retried, the record uncommitted until it succeeds — a scale decision's cost is not lost when Redis
fails during it, and its once-only marker keeps it from being counted twice. Everything published
(CostRecords, budget states, dead letters) goes through the one Publisher.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from llmbus.bus.codec import BadMessage
from llmbus.bus.service import Phase, ServiceRuntime
from llmbus.bus.tables import resume_time_ms
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, ErrorCode, PriceBookUpdate, ScaleDecision, WorkerStatus, now_ms
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.cost_accounting.adapters.gc_tuning import tune_gc
from llmbus_services.cost_accounting.adapters.publishing import CostPublisher
from llmbus_services.cost_accounting.adapters.store import CostStore
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.cost_accounting.core.budgets import load_budgets
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_services.cost_accounting.flows import CostHandlers

log = logging.getLogger(__name__)


class CostService:
    """The service's parts; `runtime` given (llmbus.bus.memory's, in tests) or connected by `start`."""

    def __init__(self, settings: BusSettings, cost: CostSettings, runtime: ServiceRuntime | None = None) -> None:
        self.settings = settings
        self.cost = cost
        self.topics = t.Topics(settings.topic_prefix)
        book = load_pricebook(cost.pricebook_path)
        self.ledger = GpuLedger(
            book,
            interval_ms=cost.interval_s * 1000,
            grace_ms=int(cost.grace_s * 1000),
            cold_start_requests=cost.cold_start_requests,
            prefill_token_weight=cost.prefill_token_weight,
            decode_token_weight=cost.decode_token_weight,
        )
        self.redis = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
        self.store = CostStore(self.redis, settings.topic_prefix, cost.dedupe_ttl_s)
        self.publisher = CostPublisher(lambda: self.runtime.publisher, self.topics)
        self.handlers = CostHandlers(
            book,
            self.ledger,
            load_budgets(cost.budgets_path),
            self.store,
            self.topics,
            self.publisher.publish_all,
            self.publisher.publish_records,
            self.dlq,
            batch_full_records=min(cost.backlog_batch_records, cost.batch_max_records),
            settle_s=cost.settle_s,
            billed_since=self.billed_since,
            resume_at=self.resume_at,
        )
        self._runtime = runtime
        if runtime is not None:
            self._subscribe(runtime)

    @property
    def runtime(self) -> ServiceRuntime:
        if self._runtime is None:
            raise RuntimeError("cost-accounting is not connected: start() first")
        return self._runtime

    def _subscribe(self, runtime: ServiceRuntime) -> None:
        handlers = self.handlers

        async def on_worker(status: WorkerStatus) -> None:
            handlers.on_worker(status)

        async def on_pricebook(update: PriceBookUpdate) -> None:
            try:
                handlers.on_pricebook(update)
            except ValidationError as exc:  # the current book stays; the bad one is on record
                raise BadMessage(ErrorCode.INVALID_REQUEST, f"price book: {exc}") from exc

        async def on_scaling(decision: ScaleDecision) -> None:
            await handlers.on_scaling(decision)

        # No group: every replica reads the whole compacted heartbeat table and price book.
        runtime.subscribe("workers", on_worker)
        runtime.subscribe("pricebook", on_pricebook)
        # The autoscaler's decisions: scale events per pool, beside the cold starts they cost.
        runtime.subscribe("scaling", on_scaling)
        # Self-hosted results stay uncommitted until billed (flows/billing.py: Redis data loss loses none).
        runtime.subscribe(
            "results", handlers.on_results, batch_max_records=self.cost.batch_max_records, holds=handlers.holds
        )
        runtime.every(self.cost.close_every_s, "ledger", self.tick)
        # Restoring may publish (the outbox's records, a budget alert): once the ledger knows every
        # worker's life (the followed heartbeats and price book) and before the first result is billed.
        runtime.on_start(self.handlers.restore, Phase.FOLLOWED)
        runtime.on_start(self._tune_gc, Phase.SERVING)
        runtime.on_stop(self.redis.aclose)

    async def billed_since(self, since_ms: int) -> list[CostRecord]:
        """The declared start-up read `billed`: llm.costs from `since_ms` to its end as of now."""
        return await self.runtime.read_since("billed", since_ms, self.cost.rebuild_timeout_s)

    async def resume_at(self) -> int | None:
        """When the oldest record of llm.results this service's group reads again was written."""
        group = contracts.COST.group_id("results", self.topics)
        assert group is not None
        return await resume_time_ms(self.settings, group, self.topics.name(t.RESULTS), self.settings.admin_timeout_s)

    async def dlq(self, record: ConsumerRecord, exc: Exception) -> None:
        await self.runtime.dead_letter(record, exc)

    async def start(self) -> None:
        """Connected (unless a runtime was given), then every start phase (llmbus.bus.service)."""
        if self._runtime is None:
            self._runtime = await ServiceRuntime.connect(self.settings, contracts.COST)
            self._subscribe(self._runtime)
        await self.runtime.start()

    async def _tune_gc(self) -> None:
        tune_gc(self.cost.gc_freeze, self.cost.gc_gen0_threshold)

    async def tick(self) -> None:
        """Close the ledger's final intervals (Redis or Kafka away: the same ones close on the next tick)."""
        await self.handlers.tick(now_ms(), int(self.cost.worker_expiry_s * 1000))

    async def stop(self) -> None:
        if self._runtime is not None:
            await self._runtime.stop()  # its clean-ups close Redis
        else:
            await self.redis.aclose()


async def main(settings: BusSettings, stop: asyncio.Event) -> None:
    await ServiceRuntime.serve(
        settings, contracts.COST, lambda runtime: CostService(settings, CostSettings(), runtime), stop
    )
