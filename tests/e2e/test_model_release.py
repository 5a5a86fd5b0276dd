"""Releasing versions of one model on the real broker and the real object store, from a manifest to 100 % or back.

Processes: router, scheduler, shadow-comparator, cost-accounting and three sim workers of the model
`tiny`, one per registry version: 1 (A100 step times), 2 (H100 step times, the same answers) and 3
(A100, answers drift: 85 % of the tokens differ). Everything an operator does goes through the `llmbus`
command itself: each version pushed to a bucket (s3://) and registered from its manifest (whose release
plan carries the ramp and the guardrails), each worker given its version by LLMBUS_WORKER_MODEL_REF
(it fetches and verifies the version's artifact from the bucket before it is ready), version 1 released
first (it serves at once), then version 3 (rolled back by the comparator in shadow: the rollback path)
and version 2 (shadow → 50 % → 100 %), each followed with `llmbus models watch` until it ends.

What every data point of the rollout of version 2 must say, checked on the topics and in the spans the
processes wrote: its upgrade id, and a version that is the version that really answered.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from llmbus.artifacts import ObjectStore
from llmbus.bus.tables import read_log, read_table
from llmbus.cli import models as models_cli
from llmbus.cli import trace as trace_cli
from llmbus.cli.main import app
from llmbus.client import LlmbusClient
from llmbus.contract import semconv as sc
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Comparison,
    CostRecord,
    Experiment,
    ExperimentDecision,
    ExperimentState,
    InferenceResult,
    ModelSpec,
    ModelState,
    ReleaseContext,
    ReleaseStage,
    ScaleDecision,
    TokenChunk,
    WorkerStatus,
    now_ms,
)
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_tools.cost_report import cost_report
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import eventually, user_request

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.objectstore, pytest.mark.slow]

MODEL = "tiny"
WORKERS = {
    "1": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-a100"},
    "2": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-h100"},
    "3": {"LLMBUS_WORKER_SIM_PROFILE": "llama-3.1-8b-a100", "LLMBUS_WORKER_SIM_DIVERGENCE": "0.85"},
}
# The router reads a new step a moment after the decision (and the release's start after the CLI wrote it).
ROUTER_GRACE_MS = 1500
# As in test_experiment_lifecycle.py: 12 samples make the shadow rollback of version 3 certain, and the
# latency guardrail only catches a version 4x slower (the bus's tail on a shared 2-core machine is noise).
RELEASE_PLAN = {
    "ramp": {"steps_pct": [0, 50, 100], "min_samples_per_step": 12, "min_step_s": 0},
    "guardrails": {"min_samples": 4, "max_p95_regression": 3.0},
}
# Topics whose records carry the release: each span of one, producer's or consumer's, must name it.
RELEASE_TOPICS = (t.ROUTED, t.RESULTS, t.COSTS, "llm.dispatch.")


def llmbus(settings: BusSettings, *args: str, code: int = 0) -> str:
    env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix}
    models_cli.console.width = trace_cli.console.width = 220  # unwrapped, whatever terminal the tests run in
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def push(settings: BusSettings, tmp: Path, bucket: str, version: str, parent: str | None) -> None:
    weights = tmp / f"weights-{version}"
    weights.mkdir()
    (weights / "config.json").write_text(json.dumps({"hidden_size": 128, "version": version}))
    (weights / "model.safetensors").write_bytes(random.Random(version).randbytes(64 * 1024))
    manifest = tmp / f"tiny-{version}.yaml"
    lineage = {
        "training_data_version": f"chats-v{version}",
        "training_code_commit": f"commit-{version}-abc",
        "hyperparameters": {"learning_rate": 1e-4 * int(version), "epochs": 2},
        "base_model": "llama-3.1-8b",
        "parent_version": parent,
    }
    body = {"name": MODEL, "version": version, "owner": "ml", "lineage": lineage, "release": RELEASE_PLAN}
    manifest.write_text(yaml.safe_dump(body | {"max_output_tokens": 256}))
    llmbus(settings, "models", "push", str(weights), "--manifest", str(manifest), "--to", f"s3://{bucket}/")


class Load:
    """Steady traffic to `tiny` from many users; each answer's final chunk and when it was sent."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.finals: dict[str, TokenChunk] = {}
        self.sent_ms: dict[str, int] = {}
        self.stop = asyncio.Event()
        self.rng = random.Random(11)

    async def run(self, concurrency: int = 8) -> None:
        async with LlmbusClient(self.settings) as client:
            await asyncio.gather(*[self._user(client) for _ in range(concurrency)])

    async def _user(self, client: LlmbusClient) -> None:
        while not self.stop.is_set():
            request = user_request(MODEL, self.rng)
            self.sent_ms[request.request_id] = now_ms()
            try:
                async for chunk in client.stream(request, timeout_s=60):
                    if chunk.final:
                        self.finals[request.request_id] = chunk
            except TimeoutError:
                continue  # a loaded machine; nothing below depends on one request


async def table(settings: BusSettings, base: str, model: type) -> dict:  # type: ignore[type-arg]
    return await read_table(settings, t.Topics(settings.topic_prefix).name(base), model)


async def log(settings: BusSettings, base: str, model: type) -> list:  # type: ignore[type-arg]
    return [m for _, m in await read_log(settings, t.Topics(settings.topic_prefix).name(base), model, timeout_s=60)]


async def release(settings: BusSettings, version: str) -> str:
    await asyncio.to_thread(llmbus, settings, "models", "release", f"{MODEL}@{version}")
    record = (await table(settings, t.MODELS, ModelSpec))[f"{MODEL}@{version}"]
    assert record.release is not None
    return str(record.release.upgrade_id)


async def experiment_state(settings: BusSettings, upgrade_id: str) -> ExperimentState | None:
    experiment = (await table(settings, t.EXPERIMENTS, Experiment)).get(upgrade_id)
    return experiment.state if experiment is not None else None


def spans(log_dir: Path) -> list[dict]:  # type: ignore[type-arg]
    out = []
    for path in log_dir.glob("spans-*.jsonl"):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


@pytest.fixture
def load_task() -> Iterator[list[asyncio.Task[None]]]:
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()


@pytest.mark.timeout(600)
async def test_versions_released_from_manifests_rolled_back_and_ramped_to_100_with_their_release_everywhere(
    bus_settings: BusSettings,
    services: list[ServiceProc],
    load_task: list[asyncio.Task[None]],
    tmp_path: Path,
    bucket: str,
) -> None:
    s = bus_settings
    for version, parent in (("1", None), ("2", "1"), ("3", "1")):
        await asyncio.to_thread(push, s, tmp_path, bucket, version, parent)
    assert "serving (first version)" in await asyncio.to_thread(llmbus, s, "models", "release", f"{MODEL}@1")

    def traced(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
        return {"LLMBUS_TRACE_FILE": str(tmp_path / f"spans-{name}.jsonl")} | (env or {})

    services.append(ServiceProc("llmbus_services.router", s, env=traced("router")).start())
    stale = {"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "30"}  # a loaded machine delays heartbeats
    services.append(ServiceProc("llmbus_services.scheduler", s, env=traced("scheduler", stale)).start())
    services.append(ServiceProc("llmbus_services.cost_accounting", s, env=traced("cost")).start())
    comparator = {"LLMBUS_COMPARATOR_DECIDE_INTERVAL_S": "0.5", "LLMBUS_COMPARATOR_PAIR_TTL_S": "30"}
    services.append(ServiceProc("llmbus_services.shadow_comparator", s, env=traced("comparator", comparator)).start())
    for version, env in WORKERS.items():
        worker = {
            "LLMBUS_WORKER_WORKER_ID": f"tiny-v{version}",
            "LLMBUS_WORKER_MODEL_REF": f"{MODEL}@{version}",  # its artifact fetched from the bucket, verified
            "LLMBUS_ARTIFACT_CACHE_DIR": str(tmp_path / "node-cache"),
            "LLMBUS_WORKER_SIM_SPEEDUP": "10",
        }
        name = f"tiny-v{version}"
        services.append(
            ServiceProc("llmbus_services.engine_worker", s, name=name, env=traced(name, worker | env)).start()
        )
    await wait_workers_ready(s, {f"tiny-v{v}" for v in WORKERS}, timeout_s=240)
    heartbeats = await table(s, t.WORKERS, WorkerStatus)
    assert {w: heartbeats[f"tiny-v{w}"].model_version for w in WORKERS} == {v: v for v in WORKERS}
    assert all({"fetch", "verify"} <= set(heartbeats[f"tiny-v{w}"].cold_start_phases_s) for w in WORKERS)
    assert {f.key for f in ObjectStore().objects(bucket)} >= {f"{MODEL}/{v}/bf16/model.safetensors" for v in WORKERS}

    load = Load(s)
    load_task.append(asyncio.create_task(load.run()))

    # 1. Version 3 answers badly: compared in shadow, never shown, rolled back; version 1 keeps serving.
    bad = await release(s, "3")
    watched = await asyncio.to_thread(llmbus, s, "models", "watch", MODEL, "--timeout-s", "240", code=1)
    assert f"registered → shadow ({bad} shadow)" in watched and f"release {bad} of {MODEL}@3: rolled back" in watched

    async def rolled_back() -> bool:
        return await experiment_state(s, bad) == ExperimentState.ROLLED_BACK

    await eventually(rolled_back, timeout_s=30, interval_s=0.5)
    models = await table(s, t.MODELS, ModelSpec)
    assert models[f"{MODEL}@3"].state == ModelState.REGISTERED and models[MODEL].version == "1"
    back = models[f"{MODEL}@3"].transitions[-1]
    assert back.by == "shadow-comparator" and "similarity" in back.reason

    # 2. Version 2: shadow, 50 % of users, then everyone; version 1 retired.
    started_ms = now_ms()
    good = await release(s, "2")
    watched = await asyncio.to_thread(llmbus, s, "models", "watch", MODEL, "--timeout-s", "240")
    assert f"shadow → canary ({good} ab 50%)" in watched and f"canary → serving ({good} serving)" in watched
    assert f"release {good} of {MODEL}@2: promoted" in watched

    async def promoted() -> bool:
        return await experiment_state(s, good) == ExperimentState.PROMOTED

    await eventually(promoted, timeout_s=30, interval_s=0.5)
    promotions = [d for d in await log(s, t.DECISIONS, ExperimentDecision) if d.experiment_id == good]
    all_in_ms = max(d.decided_at_ms for d in promotions) + ROUTER_GRACE_MS
    await eventually(lambda: _sent_after(load, all_in_ms, 6), timeout_s=60)
    load.stop.set()
    await asyncio.wait_for(load_task[0], 90)

    models = await table(s, t.MODELS, ModelSpec)
    assert models[MODEL].version == "2" and models[MODEL].record == "serving"
    assert models[f"{MODEL}@2"].state == ModelState.SERVING and models[f"{MODEL}@1"].state == ModelState.RETIRED
    steps = [(c.to_state, c.release.label() if c.release else None) for c in models[f"{MODEL}@2"].transitions]
    assert steps == [
        (ModelState.REGISTERED, None),
        (ModelState.SHADOW, "shadow"),
        (ModelState.CANARY, "ab 50%"),
        (ModelState.SERVING, "serving"),
    ]
    history = await asyncio.to_thread(llmbus, s, "models", "history", MODEL)
    assert "served (first version)" in history and f"{bad}" in history and "rolled back" in history
    assert f"{good}" in history and "promoted" in history and "shadow → ab 50% → serving" in history
    shown = await asyncio.to_thread(llmbus, s, "models", "show", f"{MODEL}@2")
    assert all(fact in shown for fact in ("chats-v2", "commit-2-abc", "epochs=2", "parent: tiny@1", "chats-v1"))

    # Every result of the rollout names it, with the version that really answered it.
    in_rollout = {rid for rid, sent in load.sent_ms.items() if sent >= started_ms + ROUTER_GRACE_MS}
    results = [r for r in await log(s, t.RESULTS, InferenceResult) if r.model == MODEL]
    rollout = [r for r in results if (r.request_id.split(".shadow.")[0] in in_rollout)]
    assert len(rollout) >= 30
    for r in rollout:
        assert r.release is not None and r.release.upgrade_id == good, r
        assert r.release.model_version == r.model_version or r.error is not None, r
    versions = Counter((r.release.model_version, r.release.label(), r.shadow) for r in rollout if r.release)
    print(f"rollout results by (version, stage, shadow): {dict(versions)}")
    assert versions[("2", "shadow", True)] > 0 and versions[("1", "shadow", False)] > 0
    assert versions[("2", "ab 50%", False)] > 0 and versions[("1", "ab 50%", False)] > 0
    assert versions[("2", "serving", False)] > 0
    assert not any(r.model_version == "3" for r in rollout)
    users_got = Counter(c.release.model_version for rid, c in load.finals.items() if rid in in_rollout and c.release)
    assert set(users_got) == {"1", "2"} and not any(c.shadow for c in load.finals.values())
    finals = [c for rid, c in load.finals.items() if rid in in_rollout and c.error is None]
    assert finals and all(c.release is not None and c.release.upgrade_id == good for c in finals)
    after = [c for rid, c in load.finals.items() if load.sent_ms[rid] >= all_in_ms and c.error is None]
    assert after and all(c.release and (c.release.model_version, c.release.stage) == ("2", "serving") for c in after)

    # Its cost records, comparisons and decisions name it too; costs add up by version and upgrade.
    rollout_ids = {r.request_id for r in rollout}

    async def costs_in() -> bool:
        return rollout_ids <= {c.request_id for c in await log(s, t.COSTS, CostRecord)}

    await eventually(costs_in, timeout_s=90, interval_s=1)
    costs = [c for c in await log(s, t.COSTS, CostRecord) if c.request_id in rollout_ids]
    assert costs and all(c.release is not None and c.release.upgrade_id == good for c in costs)
    comparisons = [c for c in await log(s, t.COMPARISONS, Comparison) if c.experiment_id == good]
    assert comparisons and all(c.release and c.release.model_version == "2" for c in comparisons)
    decisions = [d for d in await log(s, t.DECISIONS, ExperimentDecision) if d.experiment_id == good]
    assert all(d.release and (d.release.upgrade_id, d.release.model_version) == (good, "2") for d in decisions)
    assert {d.release.stage for d in decisions if d.release} >= {ReleaseStage.SHADOW, ReleaseStage.AB}
    for decision in await log(s, t.SCALING, ScaleDecision):  # none without an autoscaler; any would say
        assert decision.pool != MODEL or isinstance(decision.release, ReleaseContext)
    client = redis_client(s.redis_url)
    try:
        report = await cost_report(client, s.topic_prefix, load_pricebook(None), now_ms())
    finally:
        await client.aclose()
    assert {f"{good}/1", f"{good}/2"} <= set(report["today"]["upgrade"])
    assert {f"{MODEL}@1", f"{MODEL}@2"} <= set(report["today"]["version"])

    # Every span of a rollout record (routed, dispatched, answered, billed) names the release.
    seen = [
        span
        for span in spans(tmp_path)
        if span["attributes"].get(sc.LLMBUS_REQUEST_ID, "").split(".shadow.")[0] in in_rollout
        and any(span["name"].startswith(s.topic_prefix + topic) for topic in RELEASE_TOPICS)
    ]
    kinds = Counter((span["kind"], span["name"].removeprefix(s.topic_prefix).split(" ")[0]) for span in seen)
    print(f"rollout spans by kind and topic: {dict(kinds)}")
    assert {kind for kind, _ in kinds} == {"PRODUCER", "CONSUMER"} and len(seen) >= 4 * len(rollout)
    assert all(span["attributes"].get(sc.LLMBUS_UPGRADE_ID) == good for span in seen)

    # `llmbus trace` prints it.
    traced_out = await asyncio.to_thread(llmbus, s, "trace", rollout[-1].request_id.split(".shadow.")[0])
    assert f"release {good}" in traced_out


async def _sent_after(load: Load, start_ms: int, n: int) -> bool:
    return sum(1 for rid, sent in load.sent_ms.items() if sent >= start_ms and rid in load.finals) >= n
