"""Cost-accounting handlers in memory (llmbus.bus.memory) with the real Redis (namespaced keys)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from llmbus.bus.memory import MemoryBus
from llmbus.bus.producer import PublishTimeout
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    BudgetState,
    BudgetStatus,
    CostKind,
    CostRecord,
    InferenceResult,
    PriceBookUpdate,
    ResultStatus,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.adapters import store as store_module
from llmbus_services.cost_accounting.app import CostService
from llmbus_services.cost_accounting.config import CostSettings
from llmbus_services.cost_accounting.core.aggregates import agg_key, read_totals
from llmbus_services.cost_accounting.core.costing import price_result
from llmbus_services.cost_accounting.core.prices import DEFAULT_PRICEBOOK_PATH
from tests.support import redis_keys

NOW = 1_780_000_000_000


def hosted(rid: str, tenant: str = "acme", **kw: object) -> InferenceResult:
    fields: dict[str, object] = {
        "request_id": rid,
        "tenant": tenant,
        "status": ResultStatus.OK,
        "model": "gpt-4.1",
        "usage": Usage(prompt_tokens=1000, cached_prompt_tokens=200, completion_tokens=500),
        "completed_at_ms": NOW,
    } | kw
    return InferenceResult.model_validate(fields)


@pytest.fixture
async def service(redis_up: None, tmp_path: Path):  # type: ignore[no-untyped-def]
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("tenants:\n  small: {limit_usd: 0.01, period: day}\n")
    settings = BusSettings(topic_prefix=f"t{uuid.uuid4().hex[:10]}.", log_json=False)
    bus = MemoryBus(settings)
    cost = CostSettings(budgets_path=str(budgets), interval_s=60, grace_s=1, settle_s=0)
    svc = CostService(settings, cost, bus.runtime(contracts.COST))
    costs = bus.spy(svc.topics.name(t.COSTS), CostRecord)
    statuses = bus.spy(svc.topics.name(t.BUDGETS), BudgetStatus)
    yield svc, bus, costs, statuses
    assert not svc.runtime.contract.undeclared(svc.topics, svc.runtime.publisher.topics_written)
    if keys := await redis_keys(svc.redis, f"{settings.topic_prefix}*"):
        await svc.redis.delete(*keys)
    await svc.redis.aclose()


async def send_result(svc: CostService, bus: MemoryBus, result: InferenceResult) -> None:
    await bus.send(svc.topics.name(t.RESULTS), result, key=result.request_id)


async def test_hosted_cache_shadow_and_dedupe(service) -> None:  # type: ignore[no-untyped-def]
    svc, bus, costs, _ = service
    await send_result(svc, bus, hosted("r1"))
    await send_result(svc, bus, hosted("r1"))  # redelivered: billed once
    await send_result(svc, bus, hosted("r2", cached=True, model="gpt-4.1-mini"))
    await send_result(svc, bus, hosted("r3", shadow=True, experiment_id="exp1", variant="cand"))
    by_id = {c.request_id: c for c in costs}
    assert len(costs) == 3
    # 800 x $2 + 200 x $0.50 + 500 x $8 per 1M tokens = 5,700 µUSD
    assert by_id["r1"].cost_micro_usd == 5700 and by_id["r1"].kind == CostKind.HOSTED
    assert by_id["r2"].cost_micro_usd == 0 and by_id["r2"].kind == CostKind.CACHE
    assert by_id["r2"].saving_micro_usd == 1000 * 0.40 + 500 * 1.60  # list price of the model it would have used
    assert by_id["r3"].booked_to == "experiment" and by_id["r3"].experiment_id == "exp1"

    day = lambda dim: agg_key(svc.topics.prefix, "day", NOW, dim)  # noqa: E731
    tenants = read_totals(await svc.store.totals(day("tenant")))
    assert tenants["acme"]["cost"] == 5700  # the shadow copy is not the tenant's
    assert tenants["acme"]["saving"] == 1200
    experiments = read_totals(await svc.store.totals(day("experiment")))
    assert experiments["exp1/cand"]["cost"] == 5700
    # a CostRecord billed twice counts once (its marker is there)
    assert await svc.store.bill([by_id["r1"]]) == [False]
    assert read_totals(await svc.store.totals(day("total")))["all"]["cost"] == 11400


async def test_outbox_billed_as_staged_before_anything_else(service) -> None:  # type: ignore[no-untyped-def]
    """A run that staged a record and stopped (before or after publishing it): the next run publishes
    and applies exactly the staged bytes, even if the price book changed since, and the result they
    price is not priced again when it comes back."""
    svc, bus, costs, _ = service
    staged = price_result(hosted("o1"), svc.handlers.book)
    assert isinstance(staged, CostRecord) and staged.cost_micro_usd == 5700
    await svc.store.stage([staged], [staged.to_bytes()])
    svc.handlers._recover = True  # as after a restart
    book = yaml.safe_load(DEFAULT_PRICEBOOK_PATH.read_text())
    book["hosted"]["gpt-4.1"]["output_per_1m"] = 16.0
    await bus.send(svc.topics.name(t.PRICEBOOK), PriceBookUpdate(book=book), key="pricebook")
    await send_result(svc, bus, hosted("o1"))  # the batch comes again after the crash
    await send_result(svc, bus, hosted("o2"))
    assert [(c.request_id, c.cost_micro_usd) for c in costs] == [("o1", 5700), ("o2", 1600 + 100 + 8000)]
    assert costs[0].to_bytes() == staged.to_bytes()
    day_total = read_totals(await svc.store.totals(agg_key(svc.topics.prefix, "day", NOW, "total")))["all"]
    assert (day_total["requests"], day_total["cost"]) == (2, 5700 + 9700)
    assert await svc.store.staged() == []


async def test_budget_alerts_once_per_threshold(service) -> None:  # type: ignore[no-untyped-def]
    svc, bus, _, statuses = service
    # $0.01 a day; each request 5,700 µUSD: 57 % then 114 %, then nothing new
    for rid in ("b1", "b2", "b3"):
        await send_result(svc, bus, hosted(rid, tenant="small"))
    assert [(s.state, s.threshold_perc) for s in statuses] == [(BudgetState.WARN, 50), (BudgetState.OVER, 100)]
    assert statuses[-1].spent_usd == pytest.approx(0.0114)  # published when 100 % was crossed


def sim_heartbeat(worker_id: str, state: WorkerState, started_at_ms: int, sent_at_ms: int) -> WorkerStatus:
    """A sim worker's heartbeat, started at `started_at_ms` with no cold start."""
    return WorkerStatus(
        worker_id=worker_id,
        node_id="n",
        state=state,
        engine="sim",
        models=["sim-llama-8b"],
        cold_start_s=0.0,
        started_at_ms=started_at_ms,
        sent_at_ms=sent_at_ms,
    )


async def test_self_hosted_priced_when_interval_closes(service) -> None:  # type: ignore[no-untyped-def]
    svc, bus, costs, _ = service
    start = NOW - NOW % 60_000
    beat = sim_heartbeat("sim-1", WorkerState.READY, start, sent_at_ms=start + 1000)
    await bus.send(svc.topics.name(t.WORKERS), beat, key="sim-1")
    result = hosted("s1", model="sim-llama-8b", worker_id="sim-1", completed_at_ms=start + 30_000)
    result.timings.engine_ms = 20_000
    await send_result(svc, bus, result)
    assert costs == []  # held until the interval closes
    stopped = beat.model_copy(update={"state": WorkerState.STOPPED, "sent_at_ms": start + 60_000})
    await bus.send(svc.topics.name(t.WORKERS), stopped, key="sim-1")
    await svc.handlers.tick(start + 120_000, 60_000)
    kinds = {c.kind: c.cost_micro_usd for c in costs}
    rate = svc.ledger.book.pool_rate("sim")
    assert kinds[CostKind.SELF_HOSTED] == rate.cost_micro(20_000)
    assert kinds[CostKind.SELF_HOSTED] + kinds[CostKind.IDLE] == rate.cost_micro(60_000)
    held, _ = await svc.store.load_held()
    assert held == []  # released once published


async def test_price_book_overridden_at_runtime(service) -> None:  # type: ignore[no-untyped-def]
    svc, bus, costs, _ = service
    book = yaml.safe_load(DEFAULT_PRICEBOOK_PATH.read_text())
    book["hosted"]["gpt-4.1"]["output_per_1m"] = 16.0
    await bus.send(svc.topics.name(t.PRICEBOOK), PriceBookUpdate(book=book), key="pricebook")
    broken = book | {"pools": {"x": {"gpu": "no-such-gpu", "models": ["m"]}}}
    await bus.send(svc.topics.name(t.PRICEBOOK), PriceBookUpdate(book=broken), key="pricebook")
    await send_result(svc, bus, hosted("p1"))
    # 800 x 2 + 200 x 0.5 + 500 x 16: the valid update applies, the invalid one is refused
    assert costs[-1].cost_micro_usd == 1600 + 100 + 8000


async def test_failed_publish_billed_from_the_outbox_first(service) -> None:  # type: ignore[no-untyped-def]
    """Kafka fails after a batch is staged: the next batch first bills what was staged, once."""
    svc, bus, costs, _ = service
    publish = svc.handlers.publish_records

    async def kafka_away(items: object) -> None:
        raise PublishTimeout("no ack from Kafka")

    svc.handlers.publish_records = kafka_away
    with pytest.raises(PublishTimeout):
        await send_result(svc, bus, hosted("f1"))
    assert costs == [] and len(await svc.store.staged()) == 1
    svc.handlers.publish_records = publish
    await send_result(svc, bus, hosted("f2"))
    await send_result(svc, bus, hosted("f1"))  # the failed batch again: already billed from the outbox
    assert [c.request_id for c in costs] == ["f1", "f2"]
    day_total = read_totals(await svc.store.totals(agg_key(svc.topics.prefix, "day", NOW, "total")))["all"]
    assert (day_total["requests"], day_total["cost"]) == (2, 2 * 5700)
    assert await svc.store.staged() == []


async def test_ledger_record_applied_before_is_not_billed_again(service) -> None:  # type: ignore[no-untyped-def]
    """A restart closes an interval again from an older cursor: a record applied before (maybe priced
    differently now) is neither published nor added again."""
    svc, bus, costs, _ = service
    start = NOW - NOW % 60_000
    beat = sim_heartbeat("sim-2", WorkerState.STOPPED, start, sent_at_ms=start + 60_000)
    await bus.send(svc.topics.name(t.WORKERS), beat, key="sim-2")
    await svc.handlers.tick(start + 120_000, 60_000)
    billed = list(costs)
    assert {c.kind for c in billed} == {CostKind.IDLE}
    day = agg_key(svc.topics.prefix, "day", NOW, "total")
    before = await svc.store.totals(day)
    again = [c.model_copy(update={"cost_micro_usd": c.cost_micro_usd + 1}) for c in billed]
    await svc.handlers._bill(again)
    assert costs == billed and await svc.store.totals(day) == before


async def test_a_record_id_is_staged_once(service) -> None:  # type: ignore[no-untyped-def]
    """Two bills of one record id (a restart closing an interval again, two owners for a moment, or two
    copies in a batch): the bytes staged first are what is published, or nothing once applied."""
    svc, _, costs, _ = service
    first = price_result(hosted("s1"), svc.handlers.book)
    assert isinstance(first, CostRecord)
    other = first.model_copy(update={"cost_micro_usd": 0})
    assert await svc.store.stage([first, other], [first.to_bytes(), other.to_bytes()]) == [(first, first.to_bytes())]
    assert await svc.store.stage([other], [other.to_bytes()]) == [(first, first.to_bytes())]
    await svc.handlers._bill([other])
    assert [c.to_bytes() for c in costs] == [first.to_bytes()]
    await svc.handlers._bill([other])  # applied now: not published again
    assert [c.to_bytes() for c in costs] == [first.to_bytes()]
    assert await svc.store.staged() == []


async def test_billing_in_chunks_each_all_or_nothing(service, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A batch larger than a script's chunk: chunks whose records are all new apply at once; one holding
    a record applied before goes record by record; a record twice in the batch counts once."""
    svc, _, _, _ = service
    monkeypatch.setattr(store_module, "BILL_CHUNK_RECORDS", 2)
    records = [price_result(hosted(f"c{i}"), svc.handlers.book) for i in range(5)]
    assert all(isinstance(r, CostRecord) for r in records)
    assert await svc.store.bill([records[2]]) == [True]  # applied before: its chunk falls back
    flags = await svc.store.bill([*records, records[0]])  # type: ignore[list-item]
    assert flags == [True, True, False, True, True, False]
    day_total = read_totals(await svc.store.totals(agg_key(svc.topics.prefix, "day", NOW, "total")))["all"]
    assert (day_total["requests"], day_total["cost"]) == (5, 5 * 5700)
