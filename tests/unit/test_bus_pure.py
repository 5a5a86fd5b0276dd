"""Pure parts of the bus: commit points, decoding, headers, chunk batching, catalog."""

from __future__ import annotations

import json

import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from llmbus.bus import BadMessage, decode
from llmbus.bus import headers as hdr
from llmbus.bus.offsets import OffsetTracker
from llmbus.contract import topics as t
from llmbus.contract.messages import ErrorCode, InferenceRequest, TokenChunk
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher


def record(value: bytes | None, key: bytes | None = None) -> ConsumerRecord:
    return ConsumerRecord("llm.requests", 0, 7, 0, 0, key, value, None, 0, len(value or b""), [])


def test_commit_point_never_passes_an_unfinished_record() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.started("p0", offset)
    tracker.done("p0", 12)
    tracker.done("p0", 11)
    assert tracker.to_commit() == {}
    tracker.done("p0", 10)
    assert tracker.to_commit() == {"p0": 13}
    tracker.committed({"p0": 13})
    assert tracker.to_commit() == {}


@given(st.permutations(list(range(30))), st.integers(0, 30))
def test_commit_point_is_first_unfinished_offset(order: list[int], finished: int) -> None:
    tracker: OffsetTracker[int] = OffsetTracker()
    for offset in range(30):
        tracker.started(0, offset)
    done = set(order[:finished])
    for offset in order[:finished]:
        tracker.done(0, offset)
    first_unfinished = min(set(range(30)) - done, default=30)
    assert tracker.to_commit().get(0, 0) == first_unfinished
    assert tracker.in_flight(0) == 30 - first_unfinished


def test_revoked_partition_is_forgotten() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    tracker.started("p0", 1)
    tracker.forget(["p0"])
    tracker.done("p0", 1)
    assert tracker.to_commit() == {}


def test_decode_sorts_failures_into_codes() -> None:
    with pytest.raises(BadMessage) as not_json:
        decode(record(b"{nope"), InferenceRequest)
    assert not_json.value.code == ErrorCode.MALFORMED
    with pytest.raises(BadMessage) as tombstone:
        decode(record(None), InferenceRequest)
    assert tombstone.value.code == ErrorCode.MALFORMED
    body = {"request_id": "r1", "tenant": "acme", "max_tokens": 0, "messages": []}
    with pytest.raises(BadMessage) as invalid:
        decode(record(json.dumps(body).encode()), InferenceRequest)
    assert invalid.value.code == ErrorCode.INVALID_REQUEST
    assert (invalid.value.request_id, invalid.value.tenant) == ("r1", "acme")
    assert "max_tokens" in invalid.value.reason
    newer = {"schema_version": 99, "request_id": "r2", "prompt": "x"}
    with pytest.raises(BadMessage, match="newer"):
        decode(record(json.dumps(newer).encode()), InferenceRequest)


def test_request_needs_input_and_rejects_unknown_fields() -> None:
    with pytest.raises(BadMessage, match="messages"):
        decode(record(json.dumps({"request_id": "r"}).encode()), InferenceRequest)
    with pytest.raises(BadMessage, match=r"(?i)extra inputs"):
        decode(record(json.dumps({"prompt": "x", "surprise": 1}).encode()), InferenceRequest)


def test_headers_carry_schema_ids_and_the_current_trace() -> None:
    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("test")
    chunk = TokenChunk(request_id="r1", tenant="acme", seq=0)
    with tracer.start_as_current_span("produce") as span:
        headers = hdr.outgoing(chunk, "engine-worker")
    values = hdr.as_dict(headers)
    assert values[hdr.SCHEMA] == "TokenChunk/1"
    assert values[hdr.REQUEST_ID] == "r1" and values[hdr.TENANT] == "acme"
    trace_id = f"{span.get_span_context().trace_id:032x}"
    assert values[hdr.TRACEPARENT].split("-")[1] == trace_id
    extracted = trace.get_current_span(hdr.trace_context(headers)).get_span_context()
    assert extracted.trace_id == span.get_span_context().trace_id


def test_batcher_flushes_first_token_at_once_then_by_count_or_time() -> None:
    now = [0.0]
    batcher = ChunkBatcher("r1", "acme", interval_ms=20, max_tokens=4, model="m", clock=lambda: now[0])
    first = batcher.add("a", 1)
    assert first is not None and first.seq == 0 and first.delta == "a"
    assert batcher.add("b", 1) is None
    assert batcher.add("c", 1) is None
    now[0] = 0.021
    timed = batcher.add("d", 1)
    assert timed is not None and (timed.seq, timed.delta, timed.tokens) == (1, "bcd", 3)
    for piece in "efg":
        assert batcher.add(piece, 1) is None
    counted = batcher.add("h", 1)
    assert counted is not None and counted.tokens == 4 and counted.seq == 2
    assert batcher.flush() is None and batcher.last_seq == 2


def test_topic_names_live_in_one_namespace() -> None:
    topics = t.Topics("ns1.")
    assert topics.name(t.REQUESTS) == "ns1.llm.requests"
    assert topics.dispatch("w7") == "ns1.llm.dispatch.w7"
    assert topics.spec_of("ns1.llm.dispatch.w7") is t.DISPATCH_SPEC
    assert topics.spec_of("ns1.llm.workers").compacted
    assert topics.group("router") == "ns1.llmbus.router"
    assert len({spec.name for spec in t.CATALOG}) == len(t.CATALOG)


def test_committed_schemas_match_the_models() -> None:
    from pathlib import Path

    from llmbus.contract.schemagen import main

    assert main(["--out", str(Path(__file__).resolve().parents[2] / "schemas"), "--check"]) == 0


async def test_watchdog_ends_a_loop_whose_poll_hangs() -> None:
    import asyncio

    from llmbus.bus.consumer import ConsumerLoop, ConsumerStalled
    from llmbus.settings import BusSettings

    class HangingConsumer:
        def assignment(self) -> set[str]:
            return set()

        async def getmany(self, **_: object) -> dict[str, list[ConsumerRecord]]:
            await asyncio.sleep(3600)  # a broker call that never returns
            return {}

    async def never_called(*_: object) -> None:
        raise AssertionError

    settings = BusSettings(watchdog_s=0.3)
    loop = ConsumerLoop(HangingConsumer(), never_called, never_called, settings, service="t")  # type: ignore[arg-type]
    with pytest.raises(ConsumerStalled):
        await asyncio.wait_for(loop.run(asyncio.Event()), 5)
