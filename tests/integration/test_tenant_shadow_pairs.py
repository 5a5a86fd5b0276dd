"""Two tenants, one request id, through the shadow comparator: two pairs, two A/B samples.

Request ids are the client's to choose, so acme and globex may both send `r-1` (with its shadow
copy `r-1.shadow.sh`, experiment `sh`) and `r-2` (an A/B request of experiment `ab`, with its cost
and feedback). The comparator runs
as a process on the real broker and Redis; the results, costs and feedback are published as the
workers, cost-accounting and the tenants would. Pass criterion, fixed before the run:
- llm.comparisons has exactly two distinct comparisons of `r-1`, one per tenant, each with
  similarity 1.0 (each shadow paired with its own tenant's primary: the two tenants' texts share
  no word, so a cross pairing scores 0);
- the candidate's aggregate counts both tenants' `r-2`: 2 samples, 2 costs summing to both
  tenants' costs, 2 feedback scores (one negative: globex's).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llmbus.bus import Bus
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Comparison,
    CostRecord,
    Feedback,
    InferenceResult,
    Message,
    ResultStatus,
    Timings,
    Usage,
)
from llmbus.domain.lifecycle import create, to_step
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.shadow_comparator.adapters.store import ComparatorStore
from llmbus_services.shadow_comparator.core.aggregates import VariantStats
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_cost_e2e import caught_up, read_log
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow]

TEXT = {"acme": "alpha beta gamma delta", "globex": "one two three four", "probe": "p q r"}
COST_USD = {"acme": 0.25, "globex": 0.5}


def result(tenant: str, request_id: str, *, shadow: bool = False, variant: str | None = None) -> InferenceResult:
    return InferenceResult(
        request_id=request_id,
        tenant=tenant,
        status=ResultStatus.OK,
        model="cand" if shadow or variant == "candidate" else "ctrl",
        text=TEXT[tenant],
        usage=Usage(prompt_tokens=5, completion_tokens=4),
        timings=Timings(ttft_ms=10, total_ms=100),
        shadow=shadow,
        experiment_id="sh" if shadow else "ab" if variant else None,
        variant=variant,
    )


async def test_two_tenants_shadow_pairs_and_ab_samples_with_one_id_never_mix(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    shadowing = create("sh", "ctrl", "cand")  # step 0: every primary of ctrl shadowed
    ab = to_step(create("ab", "ctrl", "cand"), 2)  # step 2: an A/B split
    bus = await Bus.start(bus_settings, t.CLIENT)
    store = ComparatorStore(redis_client(bus_settings.redis_url), f"{bus_settings.topic_prefix}comparator")

    async def send(topic: str, *messages: Message) -> None:
        for message in messages:
            key = getattr(message, "request_id", None) or getattr(message, "experiment_id", None)
            await bus.publisher.publish(topics.name(topic), message, key=key)

    async def compared() -> list[Comparison]:
        return await read_log(bus_settings, topics.name(t.COMPARISONS), Comparison)

    try:
        await send(t.EXPERIMENTS, shadowing, ab)
        services.append(ServiceProc("llmbus_services.shadow_comparator", bus_settings, log_dir=tmp_path).start())

        # Ready once a probe pair is compared: its results consumer reads and the experiment is known.
        async def probe_compared() -> bool:
            await send(t.RESULTS, result("probe", "p", shadow=False), result("probe", "p.shadow.sh", shadow=True))
            await asyncio.sleep(1)
            return any(c.request_id == "p" for c in await compared())

        await eventually(probe_compared, timeout_s=90, interval_s=0.5)

        for tenant in ("acme", "globex"):  # both tenants' primaries first, then both shadows
            await send(t.RESULTS, result(tenant, "r-1"), result(tenant, "r-2", variant="candidate"))
        for tenant in ("acme", "globex"):
            await send(t.RESULTS, result(tenant, "r-1.shadow.sh", shadow=True))

        async def results_read() -> bool:
            return await caught_up(bus_settings, topics.group(t.COMPARATOR), topics.name(t.RESULTS))

        await eventually(results_read, timeout_s=60, interval_s=0.5)
        of_r1 = [c for c in await compared() if c.request_id == "r-1"]
        assert sorted({c.comparison_id for c in of_r1}) == ["acme:r-1:sh", "globex:r-1:sh"], of_r1
        assert all(c.similarity == 1.0 for c in of_r1), [(c.comparison_id, c.similarity) for c in of_r1]

        # Costs and feedback after the results are linked (a cost before its result joins nothing).
        for tenant in ("acme", "globex"):
            await send(t.COSTS, CostRecord(request_id="r-2", tenant=tenant, model="cand", cost_usd=COST_USD[tenant]))
            await send(t.FEEDBACK, Feedback(request_id="r-2", tenant=tenant, score=1.0 if tenant == "acme" else 0.0))

        async def joined() -> bool:
            costs = await caught_up(bus_settings, topics.group(t.COMPARATOR, "costs"), topics.name(t.COSTS))
            feedback = await caught_up(bus_settings, topics.group(t.COMPARATOR, "feedback"), topics.name(t.FEEDBACK))
            return costs and feedback

        await eventually(joined, timeout_s=60, interval_s=0.5)
        candidate = VariantStats.from_fields(await asyncio.wait_for(store.read_agg("ab", 2, "candidate"), 10))
        assert (candidate.n, candidate.cost_n, candidate.feedback_n) == (2, 2, 2), candidate
        assert candidate.cost_usd == pytest.approx(sum(COST_USD.values()))
        assert candidate.feedback_negative == 1
    finally:
        await bus.stop()
        await store.drop()
        await store.close()
