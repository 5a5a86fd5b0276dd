"""Records near the size limit on the real broker: the router dead-letters them (bounded), refuses
oversize requests with a final error, and keeps serving; a stalled worker exits non-zero."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from llmbus.bus import decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, ErrorCode, ResultStatus, RoutedRequest
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import ServiceProc
from tests.integration.test_spine import raw_producer, read_until
from tests.support import results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def valid_request(request_id: str) -> bytes:
    return json.dumps(
        {"request_id": request_id, "tenant": "acme", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()


async def test_a_huge_malformed_record_is_dead_lettered_and_the_router_keeps_serving(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    topics = t.Topics(bus_settings.topic_prefix)
    router = ServiceProc("llmbus_services.router", bus_settings).start()
    services.append(router)
    dlq = await TopicTail(bus_settings, topics.name(t.DLQ)).start()
    routed = await TopicTail(bus_settings, topics.name(t.ROUTED)).start()
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()
    run = uuid.uuid4().hex[:8]
    big_id, valid_ids = f"{run}-big", [f"{run}-ok{i}" for i in range(5)]
    malformed = b"{" + b"x" * 900_000  # ~900 kB, not JSON: base64 of it alone is over the broker's limit
    # Valid JSON with a request id, over the edge limit (max_request_bytes) but under the topic's.
    oversize = json.dumps({"request_id": big_id, "tenant": "acme", "prompt": "y" * 1_000_000}).encode()
    assert bus_settings.max_request_bytes < len(oversize) < bus_settings.topic_max_message_bytes
    producer = await raw_producer(bus_settings)
    try:
        sent = await asyncio.wait_for(producer.send_and_wait(topics.name(t.REQUESTS), malformed, partition=0), 30)
        await asyncio.wait_for(producer.send_and_wait(topics.name(t.REQUESTS), oversize, partition=0), 30)
        for request_id in valid_ids:
            await asyncio.wait_for(producer.send_and_wait(topics.name(t.REQUESTS), valid_request(request_id)), 30)
    finally:
        await producer.stop()

    letters_raw = await read_until(dlq, lambda rs: len(rs) >= 2, 60)
    letters = {d.error_code: (d, len(r.value)) for r in letters_raw for d in [decode(r, DeadLetter)]}
    assert ErrorCode.MALFORMED in letters, f"no dead letter for the huge record, only {sorted(letters)}"
    garbage, garbage_size = letters[ErrorCode.MALFORMED]
    assert garbage_size < 100_000, "the dead letter is bounded, not the record base64-wrapped"
    assert garbage.raw_truncated and garbage.raw_value_size_bytes == len(malformed)
    assert (garbage.source_topic, garbage.source_partition, garbage.source_offset) == (
        topics.name(t.REQUESTS),
        0,
        sent.offset,
    ), "the letter says where the whole record is"
    too_large, _ = letters[ErrorCode.REQUEST_TOO_LARGE]
    assert too_large.request_id == big_id and too_large.raw_truncated

    routed_ids = {
        decode(r, RoutedRequest).request_id
        for r in await read_until(
            routed, lambda rs: {decode(r, RoutedRequest).request_id for r in rs} >= set(valid_ids), 60
        )
    }
    assert set(valid_ids) <= routed_ids, "valid traffic behind the huge records is still routed"

    async def sentinel() -> str:  # refused by the router too, behind the first on its partition
        after = json.dumps({"request_id": f"{run}-sentinel", "tenant": "acme", "prompt": "y" * 1_000_000})
        await asyncio.wait_for(producer.send_and_wait(topics.name(t.REQUESTS), after.encode(), partition=0), 30)
        return f"{run}-sentinel"

    producer = await raw_producer(bus_settings)
    try:
        found = await results_then_sentinel(bus_settings, {big_id}, results, sentinel)
    finally:
        await producer.stop()
    [refused] = found[big_id]
    assert refused.status == ResultStatus.ERROR and refused.error is not None
    assert refused.error.code == ErrorCode.REQUEST_TOO_LARGE, "the client of an oversize request gets a final error"
    for tail in (dlq, routed, results):
        await tail.stop()
    assert router.proc is not None and router.proc.poll() is None, "the router is still running"


async def test_a_worker_whose_dispatch_loop_stalls_exits_non_zero(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    """The watchdog (1 s) fires while a poll waits (3 s): the loop reports ConsumerStalled. The worker
    must exit with an error so its supervisor restarts it, not drain and heartbeat on or exit 0."""
    worker = ServiceProc(
        "llmbus_services.engine_worker",
        bus_settings,
        name="stalls",
        env={
            "LLMBUS_WORKER_WORKER_ID": "stalls",
            "LLMBUS_WORKER_SIM_SPEEDUP": "0",
            "LLMBUS_WATCHDOG_S": "1",
            "LLMBUS_POLL_TIMEOUT_MS": "3000",
        },
    ).start()
    services.append(worker)
    assert worker.proc is not None
    code = await asyncio.to_thread(worker.proc.wait, 90)
    assert "stalled" in worker.log_tail(200)
    assert code != 0, "a stalled worker exits with an error"
