"""Two tenants, one request id: each gets its own one result and is billed once, on its own account.

Request ids are the client's to choose (the README's example is `r-1`). Tenants `acme` and `globex`
both send `r-1` through router → scheduler → sim worker, with cost-accounting running, on the real
broker and Redis. Pass criterion, fixed before the run: on llm.results exactly one result of `r-1`
per tenant, both ok; on llm.costs exactly one record of `r-1` per tenant, booked to that tenant,
with distinct record ids, once cost-accounting has read all of llm.results.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import BookedTo, ChatMessage, CostRecord, InferenceRequest, InferenceResult, ResultStatus
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.integration.test_cost_e2e import COST_ENV, caught_up, read_log
from tests.support import eventually, start_sim_stack

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]
TENANTS = ("acme", "globex")


async def test_one_request_id_from_two_tenants_gets_two_results_each_billed_once(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    worker = start_sim_stack(bus_settings, services, tmp_path, COST_ENV)
    await wait_workers_ready(bus_settings, {"w1"}, timeout_s=120)
    bus = await Bus.start(bus_settings, t.CLIENT)
    results_tail = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    try:
        for tenant in TENANTS:  # both in flight together: the second arrives while the first runs
            ask = InferenceRequest(
                request_id="r-1",
                tenant=tenant,
                model="sim-llama-8b",
                max_tokens=24,
                messages=[ChatMessage(role="user", content=f"a question from {tenant}")],
            )
            await bus.publisher.publish(topics.name(t.REQUESTS), ask, key=ask.request_id)

        async def answered() -> list[InferenceResult]:
            got: list[InferenceResult] = []
            async for record in results_tail.records(60):
                result = decode(record, InferenceResult)  # type: ignore[arg-type]
                if result.request_id == "r-1":
                    got.append(result)
                    if {r.tenant for r in got} >= set(TENANTS):
                        break
            return got

        results = await answered()
        assert sorted(r.tenant for r in results) == sorted(TENANTS), [(r.tenant, r.status) for r in results]
        assert all(r.status == ResultStatus.OK for r in results), [(r.tenant, r.error) for r in results]

        # Billed: wait until each tenant's record is out and cost-accounting has read all of llm.results.
        async def costed() -> bool:
            costs = await read_log(bus_settings, topics.name(t.COSTS), CostRecord)
            return {c.tenant for c in costs if c.request_id == "r-1"} >= set(TENANTS)

        worker.terminate()  # drains, says STOPPED: the cost service closes its last interval
        await eventually(costed, timeout_s=90, interval_s=1)

        async def read_all_results() -> bool:
            return await caught_up(bus_settings, topics.group(t.COST, "results"), topics.name(t.RESULTS))

        await eventually(read_all_results, timeout_s=60, interval_s=0.5)
        billed = [c for c in await read_log(bus_settings, topics.name(t.COSTS), CostRecord) if c.request_id == "r-1"]
        assert Counter(c.tenant for c in billed) == Counter(TENANTS), [(c.tenant, c.record_id) for c in billed]
        assert all(c.booked_to == BookedTo.TENANT for c in billed)
        assert len({c.record_id for c in billed}) == len(TENANTS), "record ids are unique across tenants"
        # And one result each in the whole log (a second one would have been billed or dropped above).
        every_result = await read_log(bus_settings, topics.name(t.RESULTS), InferenceResult)
        logged = [r for r in every_result if r.request_id == "r-1"]
        assert Counter(r.tenant for r in logged) == Counter(TENANTS), [(r.tenant, r.produced_by) for r in logged]
    finally:
        await results_tail.stop()
        await bus.stop()
