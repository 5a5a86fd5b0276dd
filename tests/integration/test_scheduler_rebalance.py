"""Two scheduler processes on the real broker and Redis: a rebalance with requests waiting.

The first instance holds requests it cannot place (its pipeline refuses the only worker, as a
lagging or differently configured replica would); a second one joins and takes partitions of
llm.routed. The waiting requests of those partitions must be handed over: only the new owner
places or answers them. Before the fix the old owner still held them and answered them too
(here: a cancel, elsewhere their deadline, deleting the new owner's claim on the way): two
results for one request.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from llmbus.bus.replies import publish_result
from llmbus.client import collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, ControlAction, InferenceResult, OutcomeStatus, ResultStatus
from llmbus.contract.request_key import request_key
from llmbus.settings import BusSettings
from llmbus.state.store import dispatch_markers, redis_client
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_scheduler_recovery import scheduler_setup, send_routed

pytestmark = [pytest.mark.kafka, pytest.mark.redis]
MODELS = [f"model-{i}" for i in range(8)]

# The joining instance tolerates the worker's one ECC error; the default pipeline does not.
TOLERANT = """
name: tolerant
filters:
  - type: serves-model
  - type: gpu-healthy
    params: {max_ecc_uncorrected: 5}
scorers:
  - type: queue-depth
    weight: 1
picker:
  type: max-score
"""


async def test_waiting_requests_of_revoked_partitions_get_one_result(
    bus_settings: BusSettings, services: list[ServiceProc], tmp_path: Path
) -> None:
    pipeline = tmp_path / "tolerant.yaml"
    pipeline.write_text(TOLERANT)
    async with scheduler_setup(bus_settings, services, {}) as (bus, fleet, results):
        await fleet.add("w1", models=MODELS, ecc_uncorrected=1)  # the first instance never places here
        await fleet.add("probe", models=["probe-model"])
        fleet.start()
        # The first instance is up and owns llm.routed once it places a probe (it may start slowly).
        await send_routed(bus, 1, model="probe-model")
        assert await fleet.dispatches(1, timeout_s=120), "the first scheduler never came up"
        ids: list[str] = []
        for model in MODELS:
            ids += await send_routed(bus, 1, model=model)
        env = {
            "LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "5",
            "LLMBUS_SCHEDULER_TICK_MS": "100",
            "LLMBUS_SCHEDULER_PIPELINE": str(pipeline),
            "LLMBUS_SCHEDULER_INSTANCE_ID": f"joiner-{uuid.uuid4().hex[:6]}",
        }
        services.append(ServiceProc("llmbus_services.scheduler", bus_settings, name="joiner", env=env).start())
        placed = await fleet.dispatches(1, timeout_s=120)
        placed += await fleet.dispatches(len(MODELS), timeout_s=3)  # the rest of the joiner's share
        assert placed, "the joiner took some partitions and placed their waiting requests"
        # Every request is cancelled while the joiner's attempts run: what the first instance still
        # holds it answers (cancelled); what it handed over it must not answer.
        for rid in ids:
            cancel = Control(action=ControlAction.CANCEL, target_id=request_key("default", rid))
            await bus.publisher.publish(bus.topics.name(t.CONTROL), cancel, key=cancel.target_id)
        found = await collect_results(bus_settings, set(ids), timeout_s=5, tail=results)
        # The test plays the worker and finishes each attempt the way a worker does: claim the
        # final marker, publish the result, report the outcome.
        client = redis_client(bus_settings.redis_url)
        fence = dispatch_markers(client, bus_settings.topic_prefix)
        try:
            for dispatch in placed:
                assert await fence.claim_final(dispatch.request_key, dispatch.attempt), "the old owner answered it"
                result = InferenceResult(
                    request_id=dispatch.request_id, tenant="default", status=ResultStatus.OK, text="ok"
                )
                await publish_result(bus.publisher, bus.topics, result, None)
                await fence.final_published(dispatch.request_key, dispatch.attempt)
                await fleet.answer(dispatch, OutcomeStatus.COMPLETED)
        finally:
            await client.aclose()
        for rid, more in (await collect_results(bus_settings, set(ids), timeout_s=3, tail=results)).items():
            found.setdefault(rid, []).extend(more)
        moved = {d.request_id for d in placed}
        counts = {rid: [r.status.value for r in found.get(rid, [])] for rid in ids}
        assert {rid: c for rid, c in counts.items() if rid in moved} == {rid: ["ok"] for rid in moved}
        assert all(c == ["error"] for rid, c in counts.items() if rid not in moved), counts
