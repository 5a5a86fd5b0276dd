"""Engine-workers that fetch what they serve, on the real broker and the real object store.

The tiny random-weight Llama is pushed to a bucket of this module; workers are pointed at it
(LLMBUS_WORKER_ARTIFACTS) and share one node cache directory. What is proved:
- two worker processes of one node fetching the same artifact at once download it once (the store's
  own GetObject count), both become ready, and both report `fetch` and `verify` cold-start phases;
- a vLLM worker fetches, verifies and loads the artifact from the cache, and reports ready only after
  (its spans carry the phases), then answers;
- a worker given an artifact corrupted in the store never reports ready: a FAILED heartbeat whose
  reason names the digest mismatch, and exit code 3.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from llmbus.artifacts import ObjectStore, push_directory
from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.bus.tables import read_log
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Dispatch,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    WorkerState,
    WorkerStatus,
)
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.settings import BusSettings
from llmbus_services.engine_worker.adapters.model_fetch import EXIT_START_FAILED
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.vllm_config import FAST_VLLM_ENV, TINY_WORKER_ENV
from tests.fixtures.objectstore import store_requests

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.objectstore, pytest.mark.slow, pytest.mark.timeout(600)]
VLLM_COLD_START_S = 420


@dataclass
class Node:
    settings: BusSettings
    bucket: str
    artifact: ModelArtifact  # the tiny model, pushed
    cache_dir: Path
    tmp: Path

    def worker(self, worker_id: str, engine: str, artifacts: str, **env: str) -> ServiceProc:
        base = {
            "LLMBUS_WORKER_WORKER_ID": worker_id,
            "LLMBUS_WORKER_ENGINE": engine,
            "LLMBUS_WORKER_MODEL": "tiny-llama",
            "LLMBUS_WORKER_MODEL_VERSION": "1",
            "LLMBUS_WORKER_ARTIFACTS": artifacts,
            "LLMBUS_ARTIFACT_CACHE_DIR": str(self.cache_dir),
            "LLMBUS_WORKER_SIM_SPEEDUP": "0",
        }
        return ServiceProc("llmbus_services.engine_worker", self.settings, base | env, name=worker_id).start()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def node(
    tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None, objectstore_up: None
) -> AsyncIterator[Node]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    store = ObjectStore()
    bucket = f"llmbus-test-{os.urandom(8).hex()}"
    store.ensure_bucket(bucket)
    artifact = push_directory(build_tiny_llama(), f"s3://{bucket}/tiny-llama/1/fp32/", format="fp32", store=store)
    tmp = tmp_path_factory.mktemp("worker-artifacts")
    try:
        yield Node(settings, bucket, artifact, tmp / "node-cache", tmp)
    finally:
        store.remove_bucket(bucket)
        await drop_namespace(settings)


async def heartbeats(settings: BusSettings, worker_id: str) -> list[WorkerStatus]:
    """Every heartbeat the worker published, in order (llm.workers has one partition)."""
    log = await read_log(settings, t.Topics(settings.topic_prefix).name(t.WORKERS), WorkerStatus)
    return [status for _, status in log if status.worker_id == worker_id]


def ready_only_after_fetching(beats: list[WorkerStatus]) -> WorkerStatus:
    """The first READY heartbeat; every one before it STARTING or WARMING; its phases fetch and verify."""
    states = [b.state for b in beats]
    assert WorkerState.READY in states, states
    first = states.index(WorkerState.READY)
    assert set(states[:first]) <= {WorkerState.STARTING, WorkerState.WARMING}, states[:first]
    ready = beats[first]
    assert list(ready.cold_start_phases_s)[:3] == ["startup", "fetch", "verify"], ready.cold_start_phases_s
    assert ready.cold_start_s is not None
    assert sum(ready.cold_start_phases_s.values()) == pytest.approx(ready.cold_start_s, rel=0.05, abs=0.05)
    return ready


async def test_two_workers_of_a_node_download_the_artifact_once(node: Node, services: list[ServiceProc]) -> None:
    before = store_requests(node.bucket)
    as_json = node.artifact.model_dump_json()  # given whole: the only GETs are the files'
    services += [node.worker(f"fetch-{i}", "sim", as_json) for i in (1, 2)]
    await wait_workers_ready(node.settings, {"fetch-1", "fetch-2"}, timeout_s=120)
    assert store_requests(node.bucket) - before == len(node.artifact.files)
    for worker_id in ("fetch-1", "fetch-2"):
        ready = ready_only_after_fetching(await heartbeats(node.settings, worker_id))
        assert ready.model_format == "fp32" and ready.model_version == "1"
    entries = [p for p in node.cache_dir.iterdir() if not p.name.startswith(".")]
    assert len(entries) == 1  # one directory on the node, both workers load it


async def test_a_corrupted_artifact_is_refused_and_never_serves(node: Node, services: list[ServiceProc]) -> None:
    store = ObjectStore()
    prefix = "tiny-llama/2/fp32/"
    corrupt = push_directory(build_tiny_llama(), f"s3://{node.bucket}/{prefix}", format="fp32", store=store)
    size = next(f.size_bytes for f in corrupt.files if f.path == "model.safetensors")
    store.put_bytes(node.bucket, prefix + "model.safetensors", os.urandom(size))  # same size, other bytes
    # Another node: this node's cache holds the good bytes of these very digests (verified, content-addressed),
    # so a worker here would never need the store's corrupted copy.
    other_node = {"LLMBUS_ARTIFACT_CACHE_DIR": str(node.tmp / "other-node-cache"), "LLMBUS_WORKER_NODE_ID": "node-2"}
    proc = node.worker("corrupt-1", "vllm", corrupt.uri, LLMBUS_WORKER_MODEL_VERSION="2", **other_node, **FAST_VLLM_ENV)
    services.append(proc)
    assert proc.proc is not None
    started = time.monotonic()
    while proc.proc.poll() is None and time.monotonic() - started < 120:
        await asyncio.sleep(0.2)
    assert proc.proc.poll() == EXIT_START_FAILED, proc.log_tail()
    beats = await heartbeats(node.settings, "corrupt-1")
    assert beats and all(b.state != WorkerState.READY for b in beats)
    assert beats[-1].state == WorkerState.FAILED
    assert beats[-1].state_reason is not None
    assert beats[-1].state_reason.startswith("artifact_digest_mismatch: model.safetensors: sha256 ")
    assert "start failed, the worker will not serve: artifact_digest_mismatch" in proc.log_tail()


@pytest.mark.vllm
async def test_a_vllm_worker_serves_the_model_it_fetched(node: Node, services: list[ServiceProc]) -> None:
    spans = node.tmp / "spans.jsonl"
    env = TINY_WORKER_ENV | {"LLMBUS_TRACE_FILE": str(spans)}
    # The artifact's root: the worker reads the manifest push wrote there, then the files.
    services.append(node.worker("vllm-fetch-1", "vllm", node.artifact.uri, **env))
    await wait_workers_ready(node.settings, {"vllm-fetch-1"}, timeout_s=VLLM_COLD_START_S)
    ready = ready_only_after_fetching(await heartbeats(node.settings, "vllm-fetch-1"))
    assert "weights" in ready.cold_start_phases_s  # loaded by vLLM after the fetch
    names = {json.loads(line)["name"] for line in spans.read_text().splitlines()}
    assert {"engine-worker fetch model", "cold start fetch", "cold start verify"} <= names

    bus = await Bus.start(node.settings, "test")
    results = await TopicTail(node.settings, bus.topics.name(t.RESULTS)).start()
    try:
        request = InferenceRequest(prompt="the kafka broker", max_tokens=8, model="tiny-llama", tenant="acme")
        dispatch = Dispatch(routed=RoutedRequest(request=request, model="tiny-llama"), worker_id="vllm-fetch-1")
        await bus.publisher.publish(bus.topics.dispatch("vllm-fetch-1"), dispatch, key=request.request_id)
        async for record in results.records(120):
            result = decode(record, InferenceResult)
            if result.request_id == request.request_id:
                break
        else:
            pytest.fail("no result for the dispatched request")
        assert result.status == ResultStatus.OK and result.usage.completion_tokens == 8
        assert result.model_version == "1"
    finally:
        await results.stop()
        await bus.stop()
