"""A model version as a user brings it up, on the real broker, the real object store and vLLM's CPU build.

Every step goes through the `llmbus` command, as the README's "Model versions" does: the demo model
written by `llmbus models demo-model`, pushed to a bucket (s3://) and registered with the example
manifest (examples/models/tiny-llama.yaml), a vLLM worker started by `llmbus workers start NAME@1`
that fetches, verifies, loads and warms it before it is ready, its cold-start phases in `llmbus
status`, the version released (a first version serves at once) and answering through the router and
scheduler. Then version 2, one of its objects overwritten in the bucket: its worker's start fails with
the digest mismatch, it never reports ready, and while version 2 is being released (its shadow copies
asking for it) nothing is ever dispatched to it.

The release itself, shadow → A/B → 100 % from artifacts in the object store with the upgrade id on
every result, cost record and span, is tests/e2e/test_model_release.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmbus.artifacts import ObjectStore
from llmbus.bus.tables import read_log, read_table
from llmbus.cli import models as models_cli
from llmbus.cli import workers as workers_cli
from llmbus.cli.main import app
from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ChatMessage,
    Dispatch,
    InferenceRequest,
    InferenceResult,
    ModelSpec,
    ReleaseStage,
    ResultStatus,
    TokenChunk,
    WorkerState,
    WorkerStatus,
)
from llmbus.process import detached
from llmbus.settings import BusSettings, ObjectStoreSettings
from llmbus_tools.harness.service_procs import ServiceProc
from llmbus_tools.harness.vllm_config import TINY_WORKER_ENV

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.redis,
    pytest.mark.objectstore,
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "examples" / "models" / "tiny-llama.yaml"
MODEL = "tiny-e2e"
COLD_PHASES = ("fetch", "verify", "weights", "kv_pool", "kernels", "warmup")


@pytest.fixture
def user_env(bus_settings: BusSettings, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user's shell on this stack: its namespace, and a cache directory of its own
    (run directory of the workers it starts, the node's artifact cache); its workers stopped afterwards."""
    env = {
        "LLMBUS_TOPIC_PREFIX": bus_settings.topic_prefix,
        "LLMBUS_CACHE": str(tmp_path / "cache"),
        "LLMBUS_S3_CREDENTIALS_FILE": str(ObjectStoreSettings().credentials_file),
        "COLUMNS": "220",
    }
    yield env
    run_dir = tmp_path / "cache" / "run"
    for pid_file in run_dir.glob("*.pid"):
        pid = int(pid_file.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the worker and its engine core (its own session)


def llmbus(env: dict[str, str], *args: str, code: int = 0) -> str:
    models_cli.console.width = workers_cli.console.width = 220  # unwrapped, whatever terminal the tests run in
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


async def heartbeats(settings: BusSettings, worker_id: str) -> list[WorkerStatus]:
    log = await read_log(settings, t.Topics(settings.topic_prefix).name(t.WORKERS), WorkerStatus)
    return [status for _, status in log if status.worker_id == worker_id]


def ask(n: int) -> InferenceRequest:
    return InferenceRequest(
        messages=[ChatMessage(role="user", content=f"question {n}: why stream tokens over kafka?")],
        model=MODEL,
        user_id=f"u{n}",
        max_tokens=8,
    )


async def answered(settings: BusSettings, requests: list[InferenceRequest]) -> list[InferenceResult]:
    """Each request streamed to its final chunk (an answer, not an error), then its result from llm.results."""
    async with LlmbusClient(settings) as client:

        async def final(request: InferenceRequest) -> TokenChunk:
            async for chunk in client.stream(request, timeout_s=120):
                if chunk.final:
                    return chunk
            raise AssertionError(f"no final chunk for {request.request_id}")

        finals = await asyncio.gather(*(final(r) for r in requests))
    assert all(c.error is None for c in finals), finals
    ids = {r.request_id for r in requests}
    results = [r for _, r in await read_log(settings, t.Topics(settings.topic_prefix).name(t.RESULTS), InferenceResult)]
    return [r for r in results if r.request_id in ids and not r.shadow]


async def test_a_version_pushed_to_s3_is_fetched_verified_warmed_and_served_and_a_corrupted_one_never_serves(
    bus_settings: BusSettings,
    services: list[ServiceProc],
    user_env: dict[str, str],
    bucket: str,
    tmp_path: Path,
) -> None:
    s = bus_settings
    services.append(ServiceProc("llmbus_services.router", s).start())
    services.append(ServiceProc("llmbus_services.scheduler", s, {"LLMBUS_SCHEDULER_HEARTBEAT_STALE_S": "30"}).start())
    services.append(ServiceProc("llmbus_services.cost_accounting", s).start())

    def cli(*args: str, code: int = 0) -> str:
        return llmbus(user_env, *args, code=code)

    # 1. The demo model, pushed with a checksum per file and registered from the example manifest.
    weights = tmp_path / "tiny"
    await asyncio.to_thread(cli, "models", "demo-model", str(weights))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in weights.iterdir()}
    push = ("models", "push", str(weights), "--manifest", str(MANIFEST), "--to", f"s3://{bucket}/", "--format", "fp32")
    pushed = await asyncio.to_thread(cli, *push, "--set", f"name={MODEL}")
    assert f"to s3://{bucket}/{MODEL}/1/fp32/" in pushed and f"registered {MODEL}@1" in pushed
    v1 = (await read_table(s, t.Topics(s.topic_prefix).name(t.MODELS), ModelSpec))[f"{MODEL}@1"]
    [artifact] = v1.artifacts
    assert artifact.uri == f"s3://{bucket}/{MODEL}/1/fp32/" and v1.release_plan is not None
    assert v1.release_plan.ramp.steps_pct == [0, 50, 100]  # the example manifest's plan

    # 2. A vLLM worker of version 1: fetched from the bucket, verified, loaded, warmed, then ready.
    extra = [arg for key, value in TINY_WORKER_ENV.items() for arg in ("-e", f"{key}={value}")]
    started = await asyncio.to_thread(cli, "workers", "start", f"{MODEL}@1", *extra, "--timeout-s", "600")
    worker = f"{MODEL}-v1-vllm"
    assert f"{worker} ({MODEL}@1, vllm): ready, format fp32" in started, started
    beats = await heartbeats(s, worker)
    states = [b.state for b in beats]
    first_ready = states.index(WorkerState.READY)
    assert set(states[:first_ready]) <= {WorkerState.STARTING, WorkerState.WARMING}, states
    assert set(COLD_PHASES) <= set(beats[first_ready].cold_start_phases_s), beats[first_ready].cold_start_phases_s
    status = await asyncio.to_thread(cli, "status")
    row = next(line for line in status.splitlines() if line.strip().startswith(worker) and "ready" in line)
    assert MODEL in row.split()
    assert beats[first_ready].model_version == "1" and beats[first_ready].model_format == "fp32"
    cold_start = status[status.index("cold start by phase") :]  # the cold start table (its rows may wrap)
    assert any(line.strip().startswith(f"{worker}   startup") for line in cold_start.splitlines()), status
    assert all(f" {phase} " in cold_start for phase in COLD_PHASES), status

    # 3. Released (a first version serves at once) and answering through the router and scheduler.
    released = await asyncio.to_thread(cli, "models", "release", f"{MODEL}@1")
    assert "serving (first version)" in released
    upgrade_id = released.split()[1].rstrip(":")
    [result] = await answered(s, [ask(0)])
    assert result.status == ResultStatus.OK and result.worker_id == worker and result.model_version == "1", result
    assert result.usage.completion_tokens == 8
    assert result.release is not None and result.release.upgrade_id == upgrade_id
    assert result.release.stage == ReleaseStage.SERVING

    # 4. Version 2, one object overwritten in the bucket (same size, other bytes) after it was pushed.
    pushed = await asyncio.to_thread(cli, *push, "--set", f"name={MODEL}", "--set", "version=2")
    store = ObjectStore()
    key = f"{MODEL}/2/fp32/model.safetensors"
    store.put_bytes(bucket, key, os.urandom(store.stat(bucket, key).size_bytes))
    # Another node: this node's cache holds version 1's verified bytes, which are version 2's digests too.
    node_2 = ["-e", f"LLMBUS_ARTIFACT_CACHE_DIR={tmp_path / 'node-2'}", "-e", "LLMBUS_WORKER_NODE_ID=node-2"]
    refused = await asyncio.to_thread(cli, "workers", "start", f"{MODEL}@2", *extra, *node_2, code=1)
    bad = f"{MODEL}-v2-vllm"
    assert (
        f"{bad} ({MODEL}@2, vllm): failed (exit status 3): artifact_digest_mismatch: model.safetensors: sha256 "
        in refused
    )
    beats = await heartbeats(s, bad)
    assert beats and WorkerState.READY not in {b.state for b in beats} and beats[-1].state == WorkerState.FAILED
    pid = int((Path(user_env["LLMBUS_CACHE"]) / "run" / f"{bad}.pid").read_text())
    with pytest.raises(ProcessLookupError):  # exited, and reaped by the command
        os.kill(pid, 0)
    status = await asyncio.to_thread(cli, "status")
    assert any(line.strip().startswith(f"{bad}  failed: artifact_digest_mismatch") for line in status.splitlines()), (
        status
    )
    assert detached.pid_of(detached.ServiceProcess(bad, "")) is None

    # 5. Released anyway: its shadow copies ask for version 2, and nothing is dispatched to the failed worker.
    await asyncio.to_thread(cli, "models", "release", f"{MODEL}@2")
    results = await answered(s, [ask(n) for n in range(1, 7)])
    assert len(results) == 6 and all(
        r.status == ResultStatus.OK and r.worker_id == worker and r.model_version == "1" for r in results
    )
    dispatched = await read_log(s, t.Topics(s.topic_prefix).dispatch(bad), Dispatch)
    every_result = [r for _, r in await read_log(s, t.Topics(s.topic_prefix).name(t.RESULTS), InferenceResult)]
    assert dispatched == [] and not [r for r in every_result if r.worker_id == bad]
    await asyncio.to_thread(cli, "models", "rollback", MODEL)
