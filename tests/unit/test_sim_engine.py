"""SimEngine: the async wrapper (streams, abort, stop strings, admission, stats, pacing)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from llmbus.contract.engine_features import SAMPLING_KNOBS
from llmbus_services.engine_worker.adapters.engines.sim import SimConfig, SimEngine
from llmbus_services.engine_worker.core.engine import AdmissionError, Engine, EngineOutput, EngineRequest

PROMPT = "You are a helpful assistant. " * 40


async def collect(engine: SimEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


async def started(**overrides: object) -> SimEngine:
    engine = SimEngine(SimConfig(speedup=0, **overrides))  # type: ignore[arg-type]
    await engine.start()
    return engine


async def test_implements_the_engine_protocol() -> None:
    engine: Engine = await started()
    assert engine.name == "sim" and engine.max_num_seqs == 256


async def test_stream_is_complete_and_deterministic() -> None:
    engine = await started()
    outs = await collect(engine, EngineRequest("a", PROMPT, max_tokens=12, seed=7))
    assert len(outs) == 12 and [o.completion_tokens for o in outs] == list(range(1, 13))
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert not any(o.finished for o in outs[:-1])
    assert outs[-1].prompt_tokens == engine.count_tokens(PROMPT)
    text = "".join(o.delta for o in outs)
    again = "".join(o.delta for o in await collect(engine, EngineRequest("b", PROMPT, max_tokens=12, seed=7)))
    other = "".join(o.delta for o in await collect(engine, EngineRequest("c", PROMPT, max_tokens=12, seed=8)))
    assert text == again and text != other


async def test_concurrent_requests_share_the_batch_and_the_prefix_cache() -> None:
    engine = await started()
    await collect(engine, EngineRequest("warm", PROMPT + "first question", max_tokens=2))
    results = await asyncio.gather(
        *(collect(engine, EngineRequest(f"r{i}", PROMPT + f"question {i}", max_tokens=20)) for i in range(8))
    )
    assert all(r[-1].completion_tokens == 20 for r in results)
    cached = {r[-1].cached_prompt_tokens for r in results}
    # the system prompt's full blocks (of 16 pseudo-tokens), as many as its counted tokens fill
    assert cached == {min(len(PROMPT) // 64, engine.count_tokens(PROMPT) // 16) * 16}
    stats = engine.stats()
    assert stats.prefix_cache_hits_total == 8 * cached.pop()
    assert stats.generation_tokens_total == 2 + 8 * 20
    assert stats.num_requests_running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


async def test_abort_mid_stream_ends_the_stream_and_frees_the_blocks() -> None:
    engine = await started()
    outs = []
    async for out in engine.generate(EngineRequest("a", PROMPT, max_tokens=1000)):
        outs.append(out)
        if len(outs) == 3:
            assert engine.stats().num_requests_running == 1
            await engine.abort("a")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert outs[-1].completion_tokens == 3
    stats = engine.stats()
    assert stats.num_requests_running == 0 and stats.kv_blocks_free == stats.kv_blocks_total


async def test_consumer_walking_away_aborts_the_request() -> None:
    engine = await started()
    stream = engine.generate(EngineRequest("a", PROMPT, max_tokens=1000))
    await anext(stream)
    await stream.aclose()
    assert "a" not in engine.core and engine.stats().num_requests_running == 0


async def test_stop_string_ends_the_answer_before_it() -> None:
    engine = await started()
    full = "".join(o.delta for o in await collect(engine, EngineRequest("a", PROMPT, max_tokens=30, seed=1)))
    stop = full.split(" ")[6]
    outs = await collect(engine, EngineRequest("b", PROMPT, max_tokens=30, seed=1, stop=(" " + stop,)))
    text = "".join(o.delta for o in outs)
    assert outs[-1].finish_reason == "stop" and text == full[: full.index(" " + stop)]
    assert engine.stats().num_requests_running == 0


async def test_admission_refuses_what_can_never_fit() -> None:
    engine = await started(max_model_len=1000, kv_blocks_total=20)
    with pytest.raises(AdmissionError):
        engine.check_admission(900, 200)  # longer than the model
    with pytest.raises(AdmissionError):
        engine.check_admission(300, 100)  # 25 blocks > 20 in the whole cache
    engine.check_admission(200, 100)
    with pytest.raises(AdmissionError):
        await collect(engine, EngineRequest("a", "x" * 4000, max_tokens=100))


async def test_speedup_paces_steps_in_wall_time() -> None:
    engine = SimEngine(SimConfig(speedup=1.0))
    await engine.start()
    # Idle virtual time follows wall time (engine._sync_idle_clock): the steps are timed from the
    # request's arrival, whatever a loaded machine delayed before it.
    arrivals: list[float] = []
    add = engine.core.add

    def add_noting_arrival(request: Any, arrival_us: float | None = None) -> None:
        add(request, arrival_us)
        arrivals.append(engine.core.now_us)

    engine.core.add = add_noting_arrival  # type: ignore[method-assign]
    t0 = time.perf_counter()
    outs = await collect(engine, EngineRequest("a", "y" * 2048, max_tokens=10))  # 512 prompt tokens
    elapsed_s = time.perf_counter() - t0
    # 14.6 ms prefill step + 9 decode steps of 5.76 ms ≈ 66 ms on the H100 profile.
    assert outs[-1].completion_tokens == 10
    assert 0.060 <= elapsed_s < 1.0
    [arrived_us] = arrivals
    busy_us = engine.core.now_us - arrived_us
    assert busy_us == pytest.approx(5752.705 + 17.2509 * 512 + 9 * (5752.705 + 5.9991), abs=1e3)


async def test_warmup_then_stop() -> None:
    engine = await started()
    await engine.warmup()
    assert engine.stats().generation_tokens_total == 0
    stream = engine.generate(EngineRequest("a", PROMPT, max_tokens=1000))
    await anext(stream)
    await engine.stop()
    rest = [o async for o in stream]
    assert rest[-1].finish_reason == "abort"


async def test_a_host_kv_tier_shows_in_stats_and_the_heartbeat() -> None:
    from llmbus.contract.messages import WorkerState
    from llmbus_services.engine_worker.config import WorkerSettings
    from llmbus_services.engine_worker.core.status import RateTracker, build_status

    # 40 GPU blocks (640 tokens) and a 1 GiB host tier (512 blocks of 2 MiB on the H100 profile).
    engine = await started(kv_blocks_total=40, kv_offloading_gib=1.0)
    doc = "The contract says the following about delivery. " * 12  # ~150 tokens
    await collect(engine, EngineRequest("a", doc, max_tokens=2))
    await collect(engine, EngineRequest("filler", "unrelated text " * 190, max_tokens=2))  # evicts a's blocks
    outs = await collect(engine, EngineRequest("a-again", doc, max_tokens=2))
    stats = engine.stats()
    assert stats.kv_offload_blocks_total == 512
    # Every full block of the repeat is a hit: the ones the filler evicted come from the host tier.
    assert outs[-1].cached_prompt_tokens == (outs[-1].prompt_tokens - 1) // 16 * 16
    assert 0 < stats.external_prefix_cache_hits_total < outs[-1].cached_prompt_tokens
    status = build_status(
        WorkerSettings(), engine, WorkerState.READY, "topic", RateTracker(), 0.0, cold_start_s=1.0, started_at_ms=1
    )
    assert status.kv_offload_blocks_total == 512
    # what the sim honours, advertised to gateway and scheduler
    assert status.engine_features == sorted({"suffix"} | SAMPLING_KNOBS)
    hits = stats.prefix_cache_hits_total + stats.external_prefix_cache_hits_total
    assert status.prefix_cache_hit_rate == pytest.approx(hits / stats.prefix_cache_queries_total)
    await engine.stop()


async def test_the_prefill_backlog_reaches_the_heartbeat() -> None:
    """Prompts admitted and not yet prefilled are in the engine's stats and the worker's heartbeat, so the
    scheduler's pool statistics see the wait inside the engine that queue wait does not."""
    from llmbus.contract.messages import WorkerState
    from llmbus_services.engine_worker.config import WorkerSettings
    from llmbus_services.engine_worker.core.status import RateTracker, build_status

    # 256 prompt tokens a step, each step a thousand times slower than real: three prompts of ~400 tokens
    # are admitted and the first step (computed when it starts) leaves all but 256 of them to prefill
    engine = SimEngine(SimConfig(speedup=0.001, max_num_batched_tokens=256))
    await engine.start()
    prompts = [EngineRequest(f"r{i}", "word " * 400, max_tokens=2) for i in range(3)]
    (prompt_tokens,) = {engine.count_tokens(r.prompt) for r in prompts}
    assert prompt_tokens > 256  # no prompt is prefilled in the first step
    streams = [asyncio.create_task(collect(engine, r)) for r in prompts]
    await asyncio.sleep(0.05)
    stats = engine.stats()
    assert stats.prefill_backlog_tokens == 3 * prompt_tokens - 256
    status = build_status(
        WorkerSettings(), engine, WorkerState.READY, "topic", RateTracker(), 0.0, cold_start_s=1.0, started_at_ms=1
    )
    assert status.prefill_backlog_tokens == stats.prefill_backlog_tokens
    await engine.stop()
    for stream in streams:
        stream.cancel()
    await asyncio.gather(*streams, return_exceptions=True)


async def test_an_unset_max_tokens_ends_where_a_chat_answer_would() -> None:
    """No max_tokens: the answer stops on its own ("stop") at a length drawn around the median, the same for the
    same prompt and seed, never past the window; a set max_tokens is written in full ("length")."""
    engine = await started(max_model_len=8192)
    lengths = []
    for i in range(40):
        outs = await collect(engine, EngineRequest(f"u{i}", f"question {i}", max_tokens=16_384, max_tokens_auto=True))
        assert outs[-1].finish_reason == "stop" and outs[-1].completion_tokens < 8192
        lengths.append(outs[-1].completion_tokens)
    assert 60 < sorted(lengths)[20] < 280  # around the default median of 129
    again = await collect(engine, EngineRequest("u0-again", "question 0", max_tokens=16_384, max_tokens_auto=True))
    assert again[-1].completion_tokens == lengths[0]
    capped = await collect(engine, EngineRequest("c", "question 0", max_tokens=5, max_tokens_auto=True))
    assert capped[-1].completion_tokens == 5 and capped[-1].finish_reason == "length"  # the cap came first
    full = await collect(engine, EngineRequest("f", "question 0", max_tokens=300))
    assert full[-1].completion_tokens == 300 and full[-1].finish_reason == "length"


async def test_where_an_unset_max_tokens_ends_does_not_depend_on_the_tenant() -> None:
    """The cache salt (a tenant's) keys the KV blocks only: every tenant gets the same answer, as long."""
    engine = await started(max_model_len=8192)
    answers = []
    for i, salt in enumerate(("", "salt-of-acme", "salt-of-globex")):
        request = EngineRequest(f"t{i}", "question 7", max_tokens=16_384, max_tokens_auto=True, cache_salt=salt)
        outs = await collect(engine, request)
        answers.append(("".join(o.delta for o in outs), outs[-1].completion_tokens, outs[-1].finish_reason))
    assert answers[0] == answers[1] == answers[2] and answers[0][2] == "stop"
