"""The spine end to end on the real broker and Redis: each service its own process."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from llmbus.bus import decode
from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.chunks import ChunkAssembler
from llmbus.contract.messages import DeadLetter, ErrorCode, InferenceResult, ResultStatus, TokenChunk
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def start_stack(
    settings: BusSettings, services: list[ServiceProc], worker_ids: tuple[str, ...] = ("w1",), speedup: str = "50"
) -> dict[str, ServiceProc]:
    procs = {
        "router": ServiceProc("llmbus_services.router", settings).start(),
        "scheduler": ServiceProc("llmbus_services.scheduler", settings).start(),
    }
    for wid in worker_ids:
        procs[wid] = ServiceProc(
            "llmbus_services.engine_worker",
            settings,
            name=wid,
            env={"LLMBUS_WORKER_WORKER_ID": wid, "LLMBUS_WORKER_SIM_SPEEDUP": speedup},
        ).start()
    services.extend(procs.values())
    return procs


async def raw_producer(settings: BusSettings) -> AIOKafkaProducer:
    """What an outside client uses: a plain producer and JSON it wrote by hand."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True)
    await asyncio.wait_for(producer.start(), 30)
    return producer


async def read_until(tail: TopicTail, want, timeout_s: float) -> list:  # type: ignore[no-untyped-def]
    """Records (raw) until `want(records)` is true or the time is up."""
    seen: list = []
    async for record in tail.records(timeout_s):
        seen.append(record)
        if want(seen):
            break
    return seen


async def test_raw_json_request_streams_ordered_chunks_and_one_result(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    start_stack(bus_settings, services)
    await wait_workers_ready(bus_settings, {"w1"})
    tokens = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    request_id = uuid.uuid4().hex
    raw = json.dumps(
        {
            "request_id": request_id,
            "tenant": "acme",
            "model": "sim-llama-8b",
            "max_tokens": 40,
            "messages": [{"role": "user", "content": "Tell me about Kafka partitions."}],
        }
    ).encode()
    producer = await raw_producer(bus_settings)
    try:
        await asyncio.wait_for(producer.send_and_wait(topics.name(t.REQUESTS), raw, key=request_id.encode()), 30)
    finally:
        await producer.stop()

    records = await read_until(
        tokens, lambda rs: any(decode(r, TokenChunk).final for r in rs if r.key == request_id.encode()), 60
    )
    chunks = [decode(r, TokenChunk) for r in records if r.key == request_id.encode()]
    assert [c.seq for c in chunks] == list(range(len(chunks))), "chunks arrive in seq order, none missing"
    assert 2 < len(chunks) < 40, "tokens are batched into chunks, not one message per token"
    final = chunks[-1]
    assert final.final and final.usage is not None and final.usage.completion_tokens == 40
    assert sum(c.tokens for c in chunks) == 40
    found = await collect_results(bus_settings, {request_id}, timeout_s=3, tail=results)
    await tokens.stop()
    await results.stop()
    assert len(found[request_id]) == 1
    result = found[request_id][0]
    assert result.status == ResultStatus.OK and result.tenant == "acme"
    assert result.text == "".join(c.delta for c in chunks)
    assert result.usage.completion_tokens == 40 and result.usage.prompt_tokens > 0
    assert result.timings.ttft_ms is not None and result.timings.total_ms >= result.timings.ttft_ms > 0
    assert result.timings.queued_ms is not None and result.worker_id == "w1"
    assert any(h[0] == "traceparent" for h in records[0].headers), "trace context travels in headers"


async def test_malformed_and_invalid_requests_go_to_dlq_and_invalid_gets_final_error(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    dlq = await TopicTail(bus_settings, topics.name(t.DLQ)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    bad_id = uuid.uuid4().hex
    producer = await raw_producer(bus_settings)
    try:
        await producer.send_and_wait(topics.name(t.REQUESTS), b"{not json", key=b"garbage")
        invalid = {
            "request_id": bad_id,
            "tenant": "acme",
            "max_tokens": -5,
            "messages": [{"role": "wizard", "content": "hi"}],
        }
        await producer.send_and_wait(topics.name(t.REQUESTS), json.dumps(invalid).encode(), key=bad_id.encode())
    finally:
        await producer.stop()

    letters = [decode(r, DeadLetter) for r in await read_until(dlq, lambda rs: len(rs) >= 2, 60)]
    assert len(letters) == 2
    malformed, invalid_letter = sorted(letters, key=lambda d: d.error_code != ErrorCode.MALFORMED)
    assert malformed.error_code == ErrorCode.MALFORMED and base64.b64decode(malformed.raw_value_b64) == b"{not json"
    assert malformed.source_topic == topics.name(t.REQUESTS) and malformed.service == "router"
    assert invalid_letter.error_code == ErrorCode.INVALID_REQUEST and invalid_letter.request_id == bad_id
    assert "max_tokens" in invalid_letter.error and "role" in invalid_letter.error

    async def sentinel() -> str:  # refused by the router the same way
        ping = invalid | {"request_id": f"{bad_id}-sentinel"}
        producer = await raw_producer(bus_settings)
        try:
            await producer.send_and_wait(topics.name(t.REQUESTS), json.dumps(ping).encode(), key=bad_id.encode())
        finally:
            await producer.stop()
        return str(ping["request_id"])

    found = await results_then_sentinel(bus_settings, {bad_id}, results, sentinel)
    await dlq.stop()
    await results.stop()
    [result] = found[bad_id]
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.INVALID_REQUEST and result.tenant == "acme"


async def test_killed_services_resume_from_committed_offsets_without_loss_or_duplicates(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    """SIGKILL the router and the worker mid-load, restart them: every request ends exactly once."""
    topics = t.Topics(bus_settings.topic_prefix)
    procs = start_stack(bus_settings, services, speedup="20")
    await wait_workers_ready(bus_settings, {"w1"})
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    producer = await raw_producer(bus_settings)
    ids = [uuid.uuid4().hex for _ in range(60)]
    try:
        for i, rid in enumerate(ids):
            body = {"request_id": rid, "model": "sim-llama-8b", "max_tokens": 20, "prompt": f"request {i}"}
            await producer.send_and_wait(topics.name(t.REQUESTS), json.dumps(body).encode(), key=rid.encode())
            if i == 20:
                procs["router"].kill()
                procs["w1"].kill()
                await asyncio.sleep(1)
                procs["router"].start()
                procs["w1"].start()
    finally:
        await producer.stop()
    found: dict[str, list[InferenceResult]] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while loop.time() < deadline and len(found) < len(ids):
        more = await collect_results(bus_settings, set(ids), timeout_s=2, tail=results)
        for rid, got in more.items():
            found.setdefault(rid, []).extend(got)
    # a little longer, so a late duplicate would be seen
    for rid, got in (await collect_results(bus_settings, set(ids), timeout_s=3, tail=results)).items():
        found.setdefault(rid, []).extend(got)
    await results.stop()
    missing = [rid for rid in ids if rid not in found]
    duplicated = {rid: len(rs) for rid, rs in found.items() if len(rs) > 1}
    assert not missing, f"{len(missing)} requests never got a final result"
    assert not duplicated, f"duplicated final results: {duplicated}"
    assert all(rs[0].status == ResultStatus.OK for rs in found.values())


async def test_a_worker_killed_mid_stream_and_back_at_once_answers_as_a_new_attempt(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    """SIGKILL the only worker while it streams, restart it under its id before the scheduler would call it
    dead: the new process takes the uncommitted Dispatch again. Run again as the same attempt, its chunks
    would reuse the seq numbers the dead process sent, with another text wherever sampling differs, and a
    reader would splice the two. Pass criterion, fixed before the run: the one result comes from a later
    attempt than the chunks streamed before the kill; that attempt's chunks are numbered without a gap from
    where they continue the earlier attempt (`continues.seq`, docs/delivery.md) or from 0, and a reader
    following the chunk contract shows exactly the result's text, never restarted."""
    topics = t.Topics(bus_settings.topic_prefix)
    procs = start_stack(bus_settings, services, speedup="1")
    await wait_workers_ready(bus_settings, {"w1"})
    tokens = await TopicTail(bus_settings, topics.name(t.TOKENS)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    request_id = uuid.uuid4().hex
    body = {"request_id": request_id, "model": "sim-llama-8b", "max_tokens": 600, "prompt": "a long answer"}
    producer = await raw_producer(bus_settings)
    try:
        await asyncio.wait_for(
            producer.send_and_wait(topics.name(t.REQUESTS), json.dumps(body).encode(), key=request_id.encode()), 30
        )
    finally:
        await producer.stop()
    key = request_id.encode()
    before_records = await read_until(tokens, lambda rs: any(r.key == key for r in rs), 60)
    before = [c for c in (decode(r, TokenChunk) for r in before_records) if c.request_id == request_id]
    assert before and not before[-1].final, "the kill must land mid-stream"
    procs["w1"].kill()
    procs["w1"].start()
    records = await read_until(tokens, lambda rs: any(r.key == key and decode(r, TokenChunk).final for r in rs), 120)
    found = await collect_results(bus_settings, {request_id}, timeout_s=5, tail=results)
    await tokens.stop()
    await results.stop()
    [result] = found[request_id]
    assert result.status == ResultStatus.OK
    assert result.attempt > before[0].attempt
    chunks = [c for c in (decode(r, TokenChunk) for r in [*before_records, *records] if r.key == key)]
    last = [c for c in chunks if c.attempt == result.attempt]
    first_seq = last[0].continues.seq if last[0].continues is not None else 0
    assert [c.seq for c in last] == list(range(first_seq, first_seq + len(last)))
    client = ChunkAssembler()
    for chunk in chunks:
        client.add(chunk)
    assert (client.text, client.restarts) == (result.text, 0)
