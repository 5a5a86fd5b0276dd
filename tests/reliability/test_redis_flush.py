"""Redis data loss mid-run: the bus's Redis (final markers, scheduler state, cost-accounting's
outbox, once-only markers and totals) is FLUSHALLed twice while requests flow router → scheduler → sim
workers → cost-accounting; after the second flush cost-accounting is SIGKILLed and restarted, so
it reads results again whose once-only markers are gone. The instance is private (started here on
a free port, never the shared 6379).

Pass criterion, fixed before the run (docs/delivery.md, "What Redis data loss costs"):
- no crash loop: no service exits by itself more than once;
- every request gets a result (0 lost); a request in flight at the flush may get a second result
  (its final marker is gone), at most `DOUBLED_BOUND` of them;
- billing survives by its second line of defence, the record id: copies of one record id carry
  the same price, so the per-tenant totals over distinct record ids equal the sum over distinct
  results' prices, and no record exists for a request without a result. Redis's own totals are
  not compared (the flush may erase them; llm.costs is the book of record).
- with the services running through the flushes: every result has a cost record (whose record id
  is its request id).
- with cost-accounting SIGKILLed right after a flush (`make reliability`): the same, every result billed and no record
  id at two prices. The self-hosted results it held in Redis for their interval's pricing are gone
  with the flush, but their offsets were never committed (held open until billed), so the restart
  reads them again, and the once-only markers it rebuilds from llm.costs keep what was billed
  before from being billed again; the reconciliation of llm.results against llm.costs
  (`llmbus.audit.bills.check_bills`) finds nothing unbilled.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from llmbus.audit import Seen, read_namespace
from llmbus.audit.bills import check_bills
from llmbus.contract import topics as t
from llmbus.contract.messages import BookedTo, CostKind, CostRecord
from llmbus.contract.request_key import request_key
from llmbus_tools.harness.reliability.effects import costs_in, results_in
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from llmbus_tools.harness.secured import SecuredBroker
from tests.reliability.common import SHORT, Faults, Run, at, deployed, run_scenario

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(400)]

SIZE = SHORT
DOUBLED_BOUND = int(SIZE.rate_per_s * 5)  # what can be in flight at the flush: ~5 s of load


def deduped_billing_problems(costs: list[CostRecord], result_ids: set[str]) -> tuple[list[str], dict[str, int]]:
    """What a consumer of llm.costs gets by keeping the first record per record id."""
    problems: list[str] = []
    billed = [c for c in costs if c.kind not in (CostKind.IDLE, CostKind.COLD_START_WASTE)]
    by_id: dict[str, list[CostRecord]] = {}
    for record in billed:
        by_id.setdefault(record.record_id, []).append(record)
    problems += [
        f"record {rid} is not its request's key {r[0].tenant}:{r[0].request_id}"
        for rid, r in by_id.items()
        if rid != request_key(r[0].tenant, r[0].request_id)
    ]
    problems += [
        f"record {rid}: copies priced apart {[c.cost_micro_usd for c in copies]}"
        for rid, copies in by_id.items()
        if len({(c.cost_micro_usd, c.tenant, c.booked_to) for c in copies}) > 1
    ]
    billed_ids = {copies[0].request_id for copies in by_id.values()}
    problems += [f"result {rid} unbilled" for rid in sorted(result_ids - billed_ids)][:5]
    problems += [f"record of {rid} without a result" for rid in sorted(billed_ids - result_ids)][:5]
    per_tenant = Counter[str]()
    for copies in by_id.values():
        if copies[0].booked_to == BookedTo.TENANT:
            per_tenant[copies[0].tenant] += copies[0].cost_micro_usd
    return problems, dict(per_tenant)


async def flush_run(
    broker: SecuredBroker, tmp_path: Path, kill_cost: bool, answer_timeout_s: float
) -> tuple[Outcome, list[str], list[Seen], t.Topics]:
    """The stack as deployed on a private Redis, the load, two FLUSHALLs (the second followed by a cost
    SIGKILL when `kill_cost`); returns the outcome, the services' own exits and the records."""
    run = Run(SIZE, tmp_path, broker)
    deployment = await asyncio.to_thread(run.deployment)  # on a Redis of its own, with its ACL users
    redis = deployment.redis
    assert redis is not None
    prefix = deployment.prefix
    faults = Faults()

    async def flush() -> None:
        client = await redis.client()  # Redis's `default` user: FLUSHALL is no service's command
        try:
            kinds = Counter[str]()
            async for key in client.scan_iter(count=1000):
                kinds[":".join(key.decode().removeprefix(prefix).split(":")[:2])] += 1
            await asyncio.wait_for(client.flushall(), 10)
        finally:
            await client.aclose()
        faults.note(f"FLUSHALL on the bus's Redis: {sum(kinds.values())} keys gone, {dict(kinds.most_common(8))}")

    size = dataclasses.replace(SIZE, answer_timeout_s=answer_timeout_s)
    try:
        async with deployed(deployment, tmp_path) as running:
            stack = running.stack

            async def flush_then_kill_cost() -> None:
                """The flush, then cost-accounting SIGKILLed: it reads its uncommitted results again, and
                their seen markers are gone (the case that bills a record id twice)."""
                await flush()
                stack.kill("cost")
                faults.note("SIGKILL cost")
                await asyncio.sleep(1)
                stack.restart("cost")
                faults.note("cost restarted")

            second = flush_then_kill_cost if kill_cost else flush
            hooks = {at(size, 0.3): faults.spawn(flush), at(size, 0.7): faults.spawn(second)}
            budget = ErrorBudget().allow(("internal",), DOUBLED_BOUND, "the final markers were flushed")
            outcome = await run_scenario("redis_flushall", running, size, hooks, faults, budget)
            return outcome, stack.crashes, await read_namespace(deployment.operator), deployment.topics
    finally:
        await asyncio.to_thread(run.close)


def judge(outcome: Outcome, crashes: list[str]) -> None:
    exits = Counter(c.split()[0] for c in crashes)
    assert all(n <= 1 for n in exits.values()), f"crash loop: {crashes}"
    assert outcome.report.lost == 0, outcome.verdict()
    assert outcome.report.doubled <= DOUBLED_BOUND, outcome.verdict()
    assert not outcome.errors_over_budget, outcome.verdict()


async def test_flushall_mid_run_loses_nothing_and_bills_every_result(
    tmp_path: Path, kafka_up: None, deployed_broker: SecuredBroker
) -> None:
    outcome, crashes, records, topics = await flush_run(deployed_broker, tmp_path, False, SIZE.answer_timeout_s)
    judge(outcome, crashes)
    results = results_in(topics, records)
    problems, per_tenant = deduped_billing_problems(costs_in(topics, records), results)
    assert not problems, problems
    assert sum(per_tenant.values()) > 0
    print(f"redis_flushall: per-tenant µUSD over distinct record ids {per_tenant}; " + "; ".join(outcome.notes))


@pytest.mark.reliability
async def test_flushall_then_cost_sigkill_bills_every_result_once(
    tmp_path: Path, kafka_up: None, deployed_broker: SecuredBroker
) -> None:
    outcome, crashes, records, topics = await flush_run(deployed_broker, tmp_path, True, 30)
    judge(outcome, crashes)
    results = results_in(topics, records)
    costs = costs_in(topics, records)
    problems, _ = deduped_billing_problems(costs, results)
    assert problems == [], problems
    reconciled = check_bills(costs, results, {})
    assert reconciled.unbilled == 0, reconciled
    print(
        f"redis_flushall+cost SIGKILL: {reconciled.unbilled} of {len(results)} results unbilled; "
        + "; ".join(outcome.notes)
    )
