"""The pipeline benchmark's summaries of queued time (replay) and token streaming: pure functions."""

from __future__ import annotations

import pytest

from bench.pipeline_load import ChunkMeter
from bench.pipeline_queued import engine_room, percentiles, queue_hops, summarise_queued
from bench.pipeline_report import _markdown
from bench.pipeline_stream import summarise_stream


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentiles(values) == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
    assert percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
    # One slow request in 100 is the p99's: the tail is not averaged away.
    assert percentiles([1.0] * 99 + [500.0])["p99"] == 1.0
    assert percentiles([1.0] * 98 + [500.0, 500.0])["p99"] == 500.0


def _result(rid: str, received_ms: int, queued_ms: float | None, attempt: int = 1) -> dict:
    return {"request_id": rid, "attempt": attempt, "timings": {"received_at_ms": received_ms, "queued_ms": queued_ms}}


def _dispatch(rid: str, routed_ms: int, dispatched_ms: int, attempt: int = 1) -> dict:
    return {
        "routed": {"request": {"request_id": rid}, "routed_at_ms": routed_ms},
        "attempt": attempt,
        "dispatched_at_ms": dispatched_ms,
    }


def test_queue_hops_split_queued_time_by_the_dispatch_of_the_answering_attempt() -> None:
    results = {
        "a": _result("a", 1000, 30.0),  # router 5, scheduler 15, worker 10
        "b": _result("b", 2000, 400.0, attempt=2),  # handed back once: attempt 2's Dispatch counts
        "c": _result("c", 3000, None),  # no engine ran it (e.g. a cache hit): no queued time
        "d": _result("d", 4000, 12.0),  # its Dispatch was not read: queued only
    }
    dispatches = {
        ("a", 1): _dispatch("a", 1005, 1020),
        ("b", 1): _dispatch("b", 2002, 2010),
        ("b", 2): _dispatch("b", 2002, 2390, attempt=2),
    }
    hops = queue_hops(results, dispatches)
    assert sorted(hops["queued"]) == [12.0, 30.0, 400.0]
    assert hops["router"] == [5.0, 2.0]
    assert hops["scheduler"] == [15.0, 388.0]
    assert hops["worker"] == [10.0, 10.0]
    # The hops add up to the queued time of each request they cover.
    for i, queued in enumerate((30.0, 400.0)):
        assert hops["router"][i] + hops["scheduler"][i] + hops["worker"][i] == pytest.approx(queued)


def test_summarise_queued_judges_the_target_at_its_rate() -> None:
    fast = {f"r{i}": _result(f"r{i}", 1000, 20.0 + i % 5) for i in range(200)}
    met = summarise_queued(fast, {}, sent=200, rate_per_s=100.0)
    assert met["verdict"] == "met"
    assert met["results_read"] == 200 and met["with_queued_time"] == 200 and met["with_dispatch"] == 0
    assert met["queued_ms"] == {"p50": 22.0, "p90": 24.0, "p99": 24.0}
    slow_rate = summarise_queued(fast, {}, sent=200, rate_per_s=25.0)
    assert str(slow_rate["verdict"]).startswith("within 100 ms, but at 25/s")
    slow = {f"r{i}": _result(f"r{i}", 1000, 3600.0, attempt=1 + (i == 0)) for i in range(10)}
    missed = summarise_queued(slow, {}, sent=12, rate_per_s=100.0)
    assert missed["verdict"] == "missed by 3500.0 ms"
    assert missed["retried"] == 1 and missed["sent"] == 12
    assert summarise_queued({}, {}, sent=5, rate_per_s=100.0)["verdict"] == "no queued times read"


def _beat(waiting: int, running: int, kv: float, models: tuple[str, ...] = ("sim-llama-8b",)) -> dict:
    return {"models": list(models), "num_requests_waiting": waiting, "num_requests_running": running} | {
        "max_num_seqs": 256,
        "kv_cache_usage_perc": kv,
    }


def test_engine_room_from_pool_stats_with_heartbeats_as_context() -> None:
    pools = [{"pool": "sim-llama-8b", "queued": 40, "oldest_wait_ms": 900.0}, {"pool": "other", "queued": 999}]
    beats = [_beat(0, 3, 0.1), _beat(2, 12, 0.4), _beat(7, 1, 0.9, ("other",))]
    room = engine_room(beats, pools, "sim-llama-8b")
    assert room["heartbeats"] == 2 and room["engine_waiting_max"] == 2 and room["engine_running_max"] == 12
    assert room["kv_cache_usage_max"] == 0.4 and room["max_num_seqs"] == 256
    assert room["scheduler_held_max"] == 40 and room["scheduler_oldest_wait_ms_max"] == 900.0
    assert room["verdict"] == "the scheduler held up to 40 waiting for room: part of its hop is that wait"
    # The engine's own queue is after engine start: it does not make the queued time a wait for room.
    none_held = engine_room(beats, [{"pool": "sim-llama-8b", "queued": 0}] * 3, "sim-llama-8b")
    assert none_held["verdict"] == "the scheduler held none at its 3 snapshot(s)"
    nothing = engine_room([], [], "sim-llama-8b")
    assert nothing["verdict"] == "no pool statistics read" and nothing["engine_waiting_max"] is None


def test_chunk_meter_counts_only_while_on() -> None:
    meter = ChunkMeter()
    meter.add(1000, 0, 16, 1005.0)  # before the window
    meter.start()
    meter.add(2000, 0, 16, 2003.5)
    meter.add(2010, 0, 4, 2050.0)
    meter.stop()
    meter.add(3000, 0, 16, 3001.0)  # after it
    assert (meter.tokens, meter.chunks) == (20, 2)
    assert meter.delivery_ms == [3.5, 40.0]
    assert meter.timestamp_types == {0}


def test_summarise_stream_rates_percentiles_and_verdicts() -> None:
    meter = ChunkMeter()
    meter.start()
    for i in range(100):
        meter.add(0, 0, 16, 10.0 if i < 99 else 80.0)  # one slow chunk in 100
    cpu_s = {"router": 0.0, "scheduler": 0.1, "worker": 0.8, "broker": 0.4, "client": 0.2, "upstream": float("nan")}
    stream = summarise_stream(meter, elapsed_s=2.0, cpu_s=cpu_s)
    assert stream["tokens_per_s"] == 800.0 and stream["chunks_per_s"] == 50.0 and stream["tokens_per_chunk"] == 16.0
    assert stream["chunk_delivery_ms"] == {"p50": 10.0, "p90": 10.0, "p99": 10.0}
    assert stream["timestamps"] == "CreateTime"
    # CPU per 1,000 tokens delivered: 1.6 thousand tokens; control plane = router + scheduler + worker + broker.
    assert stream["cpu_ms_per_1k_tokens"]["worker"] == 500.0  # type: ignore[index]
    assert "upstream" not in stream["cpu_ms_per_1k_tokens"]  # type: ignore[operator]
    assert stream["control_plane_cpu_ms_per_1k_tokens"] == 812.5
    assert stream["verdict"] == {"tokens_per_s": "missed: 0.8% of it", "chunk_delivery_p99": "met"}
    meter.add(0, 1, 16, 90.0)
    meter.add(0, 1, 16, 90.0)
    late = summarise_stream(meter, elapsed_s=0.01, cpu_s={})
    assert late["verdict"] == {"tokens_per_s": "met", "chunk_delivery_p99": "missed by 40.0 ms"}
    assert late["timestamps"] == [0, 1]  # a broker's LogAppendTime would not be the producer's send


def test_markdown_has_the_queued_and_streaming_sections() -> None:
    quick = {f"r{i}": _result(f"r{i}", 1000, 20.0) for i in range(10)}
    meter = ChunkMeter()
    meter.start()
    meter.add(0, 0, 16, 5.0)
    replay_row: dict[str, object] = {"tree": "after", "engine": "sim", "load": "azure replay 100/s"}
    replay_row |= {"first_token_ms": {"p50": 1, "p99": 2}, "final_ms": {"p50": 1, "p99": 2}}
    replay_row["queued"] = summarise_queued(quick, {}, sent=10, rate_per_s=100.0)
    stream_row: dict[str, object] = {"tree": "after", "engine": "sim", "load": "stream c=16, 512 tokens"}
    stream_row["requests_per_s"] = 3.0
    stream_row |= {"first_token_ms": {"p50": 1, "p99": 2}, "final_ms": {"p50": 1, "p99": 2}}
    stream_row["stream"] = summarise_stream(meter, 1.0, {})
    text = _markdown([replay_row, stream_row], "python -m bench.pipeline_bench --quick")
    assert "## Queued time of the trace replay" in text
    assert "| after | azure replay 100/s | 10 | 10 | **20.0 / 20.0 / 20.0** |" in text
    assert "## Token streaming through the bus" in text
    assert "| after | stream c=16, 512 tokens | **16.0** |" in text
