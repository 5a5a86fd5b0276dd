"""The engine-worker process on the real vLLM CPU engine and the real broker.

Dispatches are written straight onto the worker's own topic (as the scheduler would), so
what is tested is the worker: streaming, cancel, admission, engine death and SIGTERM drain.
One worker process serves the module; the drain test ends it, so it runs last.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog, open_admin
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ChatMessage,
    Control,
    ControlAction,
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    InferenceRequest,
    InferenceResult,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    WorkerState,
    WorkerStatus,
)
from llmbus.contract.request_key import request_key
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.vllm_config import FAST_VLLM_ENV, TEST_GPU_MEMORY_UTILIZATION
from tests.fixtures.vllm_prompts import hf_tokenizer

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]
WORKER = "vllm-w1"
MAX_MODEL_LEN = 2048  # long enough that a cancel lands mid-stream even on a loaded machine
VLLM_COLD_START_S = 420


class Harness:
    def __init__(self, settings: BusSettings, bus: Bus, proc: ServiceProc) -> None:
        self.settings, self.bus, self.proc = settings, bus, proc
        self.topics = t.Topics(settings.topic_prefix)
        self.tails: dict[str, TopicTail] = {}
        self.spans: Path | None = None  # the worker process's finished spans, as JSON lines

    async def tail(self, base: str) -> TopicTail:
        if base not in self.tails:
            self.tails[base] = await TopicTail(self.settings, self.topics.name(base)).start()
        return self.tails[base]

    async def dispatch(
        self, prompt: str | None, max_tokens: int, attempt: int = 1, messages: list[ChatMessage] | None = None
    ) -> str:
        request = InferenceRequest(
            prompt=prompt, messages=messages or [], max_tokens=max_tokens, model="tiny-llama", tenant="acme"
        )
        routed = RoutedRequest(request=request, model="tiny-llama")
        await self.bus.publisher.publish(
            self.topics.dispatch(WORKER),
            Dispatch(routed=routed, worker_id=WORKER, attempt=attempt),
            key=request.request_id,
        )
        return request.request_id

    async def fresh_tail(self, base: str) -> TopicTail:
        """A tail positioned now: past whatever earlier tests left unread on the shared one."""
        return await TopicTail(self.settings, self.topics.name(base)).start()

    async def collect(self, base: str, model, want, timeout_s: float = 90, tail: TopicTail | None = None) -> list:  # type: ignore[no-untyped-def]
        tail = tail or await self.tail(base)
        seen: list = []
        async for record in tail.records(timeout_s):
            seen.append(decode(record, model))
            if want(seen):
                return seen
        raise TimeoutError(f"{base}: condition not met; saw {len(seen)} messages")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def worker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    settings = fresh_settings()
    spans = tmp_path_factory.mktemp("worker-vllm") / "spans.jsonl"
    await ensure_catalog(settings)
    proc = ServiceProc(
        "llmbus_services.engine_worker",
        settings,
        name=WORKER,
        env={
            "LLMBUS_WORKER_WORKER_ID": WORKER,
            "LLMBUS_WORKER_ENGINE": "vllm",
            "LLMBUS_WORKER_MODEL": "tiny-llama",
            "LLMBUS_WORKER_VLLM_MODEL_PATH": str(build_tiny_llama()),
            "LLMBUS_WORKER_VLLM_DTYPE": "float32",
            "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": str(MAX_MODEL_LEN),
            "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": "8",
            "LLMBUS_WORKER_VLLM_IGNORE_EOS": "true",
            "LLMBUS_WORKER_VLLM_WARMUP_ITERATIONS": "2",  # the plan's shape, small on 2 cores
            "LLMBUS_WORKER_VLLM_WARMUP_PROMPT_TOKENS": "256",
            "LLMBUS_WORKER_DRAIN_GRACE_S": "0.3",
            "LLMBUS_WORKER_VLLM_ENGINE_CORE_START_METHOD": "fork",
            # On a GPU, beside the session's engines (the CPU build ignores it)
            "LLMBUS_WORKER_VLLM_GPU_MEMORY_UTILIZATION": str(TEST_GPU_MEMORY_UTILIZATION),
            "LLMBUS_TRACE_FILE": str(spans),  # the worker's spans, its cold start's among them
            **FAST_VLLM_ENV,
        },
    ).start()
    bus = await Bus.start(settings, "test")
    harness = Harness(settings, bus, proc)
    harness.spans = spans
    for base in (t.TOKENS, t.RESULTS, t.OUTCOMES, t.WORKERS):
        await harness.tail(base)
    try:
        # vLLM's CPU cold start (import, engine-core process, weights, KV profiling) took 3-4 min in
        # CI on a loaded 2-core machine; a cold start is not what these tests measure.
        await wait_workers_ready(settings, {WORKER}, timeout_s=VLLM_COLD_START_S)
        yield harness
    finally:
        for tail in harness.tails.values():
            await tail.stop()
        await bus.stop()
        proc.kill()
        await drop_namespace(settings)
        print(f"\n--- worker log ---\n{proc.log_tail(30)}")


async def uncommitted_dispatches(harness: Harness) -> set[str]:
    """Request ids whose Dispatch record the worker's group has not committed: Kafka will deliver them
    again to the worker's next incarnation, so they are not lost."""
    settings = harness.settings
    topic = harness.topics.dispatch(WORKER)
    async with open_admin(settings) as admin:
        group = harness.topics.group(t.WORKER, WORKER)
        offsets = await asyncio.wait_for(admin.list_consumer_group_offsets(group), settings.admin_timeout_s)
    committed = {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}
    assert committed, f"no committed offsets of {WORKER} on {topic}: the check would count every dispatch as pending"
    reader = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest")
    await asyncio.wait_for(reader.start(), 30)
    pending: set[str] = set()
    try:
        batches = await asyncio.wait_for(reader.getmany(timeout_ms=3000), 30)
        for tp, records in batches.items():
            pending |= {decode(r, Dispatch).request_id for r in records if r.offset >= committed.get(tp.partition, 0)}
    finally:
        await asyncio.wait_for(reader.stop(), 30)
    return pending


def for_request(request_id: str, final: bool = False):  # type: ignore[no-untyped-def]
    def want(seen: list) -> bool:  # type: ignore[type-arg]
        mine = [m for m in seen if m.request_id == request_id]
        return any(getattr(m, "final", True) for m in mine) if final else bool(mine)

    return want


async def test_streams_chunks_result_and_outcome(worker: Harness) -> None:
    rid = await worker.dispatch("the kafka broker keeps the log", max_tokens=24)
    chunks = [
        c for c in await worker.collect(t.TOKENS, TokenChunk, for_request(rid, final=True)) if c.request_id == rid
    ]
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert chunks[-1].final and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    [result] = [r for r in await worker.collect(t.RESULTS, InferenceResult, for_request(rid)) if r.request_id == rid]
    assert result.status == ResultStatus.OK and result.worker_id == WORKER
    assert result.text == "".join(c.delta for c in chunks) and result.text
    assert result.usage.prompt_tokens > 0 and result.timings.ttft_ms is not None
    outcomes = await worker.collect(t.OUTCOMES, DispatchOutcome, for_request(rid))
    assert [o.status for o in outcomes if o.request_id == rid] == [OutcomeStatus.COMPLETED]


async def test_a_chat_is_answered_from_its_chat_template_tokens_and_ready_shows_the_cold_start(
    worker: Harness,
) -> None:
    chat = [
        ChatMessage(role="system", content="you answer about the kafka cluster"),
        ChatMessage(role="user", content="which broker?"),
        ChatMessage(role="assistant", content="the leader"),
        ChatMessage(role="user", content="and the offset?"),
    ]
    rid = await worker.dispatch(None, max_tokens=4, messages=chat)
    [result] = [r for r in await worker.collect(t.RESULTS, InferenceResult, for_request(rid)) if r.request_id == rid]
    tokenizer = hf_tokenizer(build_tiny_llama())
    conversation = [m.model_dump() for m in chat]
    expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=False)
    assert result.status == ResultStatus.OK and result.usage.prompt_tokens == len(expected)

    def is_ready(status: WorkerStatus) -> bool:
        return status.worker_id == WORKER and status.state == WorkerState.READY

    seen = await worker.collect(t.WORKERS, WorkerStatus, lambda seen: any(is_ready(x) for x in seen))
    ready = [x for x in seen if is_ready(x)][-1]
    phases = ready.cold_start_phases_s
    order = ["startup", "import", "config", "engine_process", "weights", "kv_pool", "kernels", "warmup"]
    assert list(phases) == order
    # kernels: the CPU build warms its kernels up inside the memory profile (kv_pool), ~0 s here
    assert all(v > 0 for k, v in phases.items() if k != "kernels") and ready.cold_start_s is not None
    assert sum(phases.values()) == pytest.approx(ready.cold_start_s, rel=0.05)
    # The worker's cold-start span carries the same phases and spans the same time
    assert worker.spans is not None
    spans = [json.loads(line) for line in worker.spans.read_text().splitlines()]
    [span] = [s for s in spans if s["name"] == "engine-worker cold start"]
    prefix = "llmbus.cold_start.phase."
    assert {k[len(prefix) : -2]: v for k, v in span["attributes"].items() if k.startswith(prefix)} == phases
    assert (span["end_ns"] - span["start_ns"]) / 1e9 == pytest.approx(ready.cold_start_s, abs=0.01)
    assert span["attributes"]["llmbus.worker_id"] == WORKER and span["attributes"]["llmbus.engine"] == "vllm"


async def test_cancel_through_llm_control_aborts_mid_stream(worker: Harness) -> None:
    # Alongside other long requests, so each step is slower and the cancel surely lands mid-stream
    # even when the broker is slow to show the first chunk; they are cancelled too at the end.
    tokens = await worker.fresh_tail(t.TOKENS)
    others = [await worker.dispatch(f"company {i}", max_tokens=MAX_MODEL_LEN - 40) for i in range(7)]
    rid = await worker.dispatch("a long answer about the scheduler", max_tokens=MAX_MODEL_LEN - 40)
    try:
        await worker.collect(t.TOKENS, TokenChunk, for_request(rid), tail=tokens)  # it started streaming
    finally:
        await tokens.stop()
    for target in (rid, *others):
        await worker.bus.publisher.publish(
            worker.topics.name(t.CONTROL),
            Control(action=ControlAction.CANCEL, target_id=request_key("acme", target)),
            key=request_key("acme", target),
        )
    everyone = {rid, *others}
    results = await worker.collect(t.RESULTS, InferenceResult, lambda seen: {r.request_id for r in seen} >= everyone)
    [result] = [r for r in results if r.request_id == rid]
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.CANCELLED
    assert 0 < result.usage.completion_tokens < MAX_MODEL_LEN - 40


async def test_over_capacity_is_refused_as_retryable_without_a_result(worker: Harness) -> None:
    rid = await worker.dispatch("too long", max_tokens=MAX_MODEL_LEN + 1)
    [outcome] = [o for o in await worker.collect(t.OUTCOMES, DispatchOutcome, for_request(rid)) if o.request_id == rid]
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert outcome.error.code == ErrorCode.OVER_CAPACITY and outcome.error.retryable
    results = await worker.tail(t.RESULTS)
    async for record in results.records(1.5):
        assert decode(record, InferenceResult).request_id != rid, "a refused dispatch is not final"


async def test_engine_death_is_retryable_and_the_engine_restarts(worker: Harness) -> None:
    # Eight long requests: whichever are still running when the engine core dies come back RETRYABLE.
    tokens = await worker.fresh_tail(t.TOKENS)
    rids = [
        await worker.dispatch(f"the engine will die under request {i}", max_tokens=MAX_MODEL_LEN - 40) for i in range(8)
    ]
    try:
        await worker.collect(t.TOKENS, TokenChunk, lambda seen: any(c.request_id in rids for c in seen), tail=tokens)
    finally:
        await tokens.stop()
    assert worker.proc.proc is not None
    children = psutil.Process(worker.proc.proc.pid).children(recursive=True)
    assert children, "vLLM runs its engine core in a child process"
    for child in children:
        os.kill(child.pid, signal.SIGKILL)
    outcomes = await worker.collect(t.OUTCOMES, DispatchOutcome, lambda seen: {o.request_id for o in seen} >= set(rids))
    mine = {o.request_id: o for o in outcomes if o.request_id in rids}
    assert set(mine) == set(rids), "every dispatch ends with an outcome: nothing is dropped"
    retryable = [o for o in mine.values() if o.status == OutcomeStatus.RETRYABLE]
    assert retryable, "the requests the engine was running when it died come back retryable"
    assert all(o.error is not None and o.error.retryable for o in retryable)
    assert all(o.status in (OutcomeStatus.RETRYABLE, OutcomeStatus.COMPLETED) for o in mine.values())

    def ready_again(seen: list[WorkerStatus]) -> bool:
        states = [s.state for s in seen]
        return WorkerState.UNHEALTHY in states and WorkerState.READY in states[states.index(WorkerState.UNHEALTHY) :]

    await worker.collect(t.WORKERS, WorkerStatus, ready_again, timeout_s=VLLM_COLD_START_S)
    after = await worker.dispatch("served again after the restart", max_tokens=8)
    [result] = [
        r for r in await worker.collect(t.RESULTS, InferenceResult, for_request(after)) if r.request_id == after
    ]
    assert result.status == ResultStatus.OK and result.usage.completion_tokens == 8


async def test_sigterm_drains_and_hands_back_without_losing_a_request(worker: Harness) -> None:
    # A tail of its own, positioned now: the module's shared tail may still hold earlier tests' chunks,
    # and reading through them would delay the SIGTERM until the work is already done.
    tokens = await TopicTail(worker.settings, worker.topics.name(t.TOKENS)).start()
    ids = [
        await worker.dispatch(f"drain request {i} {uuid.uuid4().hex[:6]}", max_tokens=MAX_MODEL_LEN - 40)
        for i in range(32)  # 4x max_num_seqs: most of it is still running or waiting at the SIGTERM
    ]
    try:
        async for _ in tokens.records(60):
            break  # the worker is streaming: send the SIGTERM now
    finally:
        await tokens.stop()
    assert worker.proc.proc is not None
    code = await asyncio.to_thread(worker.proc.terminate, 90)
    assert code == 0, "the worker exits cleanly after draining"
    # A dispatch the worker had not taken yet when the SIGTERM came stays uncommitted: the next
    # worker on this topic gets it. Every other one must have finished or been handed back.
    redelivered = await uncommitted_dispatches(worker)
    ended: dict[str, str] = {}
    for outcome in await worker.collect(
        t.OUTCOMES, DispatchOutcome, lambda seen: {o.request_id for o in seen} | redelivered >= set(ids), timeout_s=30
    ):
        if outcome.request_id in ids:
            ended[outcome.request_id] = outcome.status
            if outcome.status == OutcomeStatus.RETRYABLE:
                assert outcome.error is not None and outcome.error.code == ErrorCode.HANDED_BACK
    assert set(ended) | redelivered == set(ids), "every request finished, was handed back, or stays in Kafka"
    assert OutcomeStatus.RETRYABLE in ended.values(), "long requests were handed back at the end of the grace"
    last = (await worker.collect(t.WORKERS, WorkerStatus, lambda seen: seen[-1].state == WorkerState.STOPPED))[-1]
    assert last.state == WorkerState.STOPPED
