"""A LoRA adapter released against its base model on the real broker: shadow, then the A/B ramp to 100 % of
users, each step decided by the shadow-comparator, the adapter loaded on demand by the base model's workers.

Processes: router, scheduler, shadow-comparator, and two sim workers of the base model `base` with one
adapter slot each. The adapter `base-sql` is registered on llm.models as an adapter of `base`; the release
is an experiment with `base` as control and `base-sql` as candidate (`llmbus experiments create`), run on
steady traffic to `base`. The sim answers an adapter's prompt with the base model's reference answer
(divergence 0), so the comparator finds it as good and ramps it; how a worse candidate is rolled back is
tests/e2e/test_experiment_lifecycle.py's.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter

import pytest

from llmbus.bus.tables import read_log, read_table
from llmbus.cli.experiments import publish_record
from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Experiment,
    ExperimentDecision,
    ExperimentState,
    Guardrails,
    InferenceRequest,
    LoraAdapter,
    ModelSpec,
    RampPlan,
    WorkerStatus,
    now_ms,
)
from llmbus.domain.lifecycle import create
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

ADAPTER = LoraAdapter(name="base-sql", base_model="base", source="/adapters/base-sql", rank=8)
WORKERS = ("lora-1", "lora-2")
ROUTER_GRACE_MS = 1000  # the router reads a new step a moment after the decision


async def traffic(settings: BusSettings, answered: list[tuple[str, int]], stop: asyncio.Event) -> None:
    """Users asking `base`; (the model that answered, when sent) for each answer."""
    rng = random.Random(11)

    async def user(client: LlmbusClient) -> None:
        while not stop.is_set():
            request = InferenceRequest(
                user_id=f"u{rng.randrange(100_000)}",
                model="base",
                prompt=f"query {uuid.uuid4().hex[:8]}: which rows match?",
                max_tokens=12,
            )
            sent = now_ms()
            try:
                chunks = [c async for c in client.stream(request, timeout_s=60)]
            except TimeoutError:
                continue
            models = {c.model for c in chunks if c.model and c.error is None}
            answered.append((models.pop() if len(models) == 1 else "error", sent))

    async with LlmbusClient(settings) as client:
        await asyncio.gather(*[user(client) for _ in range(6)])


async def test_an_adapter_is_ramped_against_its_base_to_all_users(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    s = bus_settings
    services.append(ServiceProc("llmbus_services.router", s).start())
    services.append(
        ServiceProc("llmbus_services.scheduler", s, env={"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "30"}).start()
    )
    comparator_env = {"LLMBUS_COMPARATOR_DECIDE_INTERVAL_S": "0.5", "LLMBUS_COMPARATOR_PAIR_TTL_S": "30"}
    services.append(ServiceProc("llmbus_services.shadow_comparator", s, env=comparator_env).start())
    for wid in WORKERS:
        env = {
            "LLMBUS_WORKER_WORKER_ID": wid,
            "LLMBUS_WORKER_MODEL": "base",
            "LLMBUS_WORKER_SIM_SPEEDUP": "10",
            "LLMBUS_WORKER_SIM_MAX_LORAS": "1",
        }
        services.append(ServiceProc("llmbus_services.engine_worker", s, name=wid, env=env).start())
    await wait_workers_ready(s, set(WORKERS), timeout_s=240)
    await publish_record(s, t.MODELS, "base", ModelSpec(name="base", max_output_tokens=256))
    await publish_record(s, t.MODELS, "base-sql", ModelSpec(name="base-sql", max_output_tokens=256, lora=ADAPTER))

    answered: list[tuple[str, int]] = []
    stop = asyncio.Event()
    load = asyncio.create_task(traffic(s, answered, stop))
    try:
        ramp = RampPlan(steps_pct=[0, 50, 100], min_samples_per_step=12, min_step_s=0)
        release = create(
            "sql-release", "base", "base-sql", ramp=ramp, guardrails=Guardrails(min_samples=4, max_p95_regression=3.0)
        )
        await publish_record(s, t.EXPERIMENTS, release.experiment_id, release)

        async def promoted() -> bool:
            table = await read_table(s, t.Topics(s.topic_prefix).name(t.EXPERIMENTS), Experiment)
            e = table.get(release.experiment_id)
            return e is not None and e.state == ExperimentState.PROMOTED

        await eventually(promoted, timeout_s=300, interval_s=0.5)
        log = await read_log(s, t.Topics(s.topic_prefix).name(t.DECISIONS), ExperimentDecision)
        promotions = [d for key, d in log if key == release.experiment_id and d.decision == "promote"]
        all_in_ms = promotions[-1].decided_at_ms + ROUTER_GRACE_MS

        async def answered_since_promotion() -> bool:
            return sum(1 for _, sent in answered if sent > all_in_ms) >= 6

        await eventually(answered_since_promotion, timeout_s=60)
    finally:
        stop.set()
        await asyncio.wait_for(load, 90)
    workers = await read_table(s, t.Topics(s.topic_prefix).name(t.WORKERS), WorkerStatus)

    assert [(d.share_from_pct, d.share_to_pct) for d in promotions] == [(0, 50), (50, 100)]
    before = Counter(model for model, sent in answered if sent < promotions[0].decided_at_ms)
    after = Counter(model for model, sent in answered if sent > all_in_ms)
    assert set(before) <= {"base", "error"} and before["base"] > 0  # in shadow no user saw the adapter
    assert set(after) == {"base-sql"}, after  # all users on the adapter once the last step was read
    assert any(w.lora_adapters == ["base-sql"] for w in workers.values()), workers  # loaded on demand
