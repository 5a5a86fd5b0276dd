"""LoRA adapters on the worker: bounded slots with LRU eviction, the sim engine loading on demand (its load
time, its own prefix cache), the heartbeat's report, and the refusals (no slots, another base, a high rank)."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmbus.contract.messages import LoraAdapter, WorkerState
from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import EngineRequest, RequestRejected, adapter_refusal
from llmbus_services.engine_worker.core.lora_slots import AdapterRefused, AdapterSlots
from llmbus_services.engine_worker.core.status import RateTracker, build_status

SQL = LoraAdapter(name="sql-lora", base_model="m", source="/a/sql", rank=8)
CHAT = LoraAdapter(name="chat-lora", base_model="m", source="/a/chat", rank=8)
CODE = LoraAdapter(name="code-lora", base_model="m", source="/a/code", rank=8)


def test_slots_load_on_use_and_evict_the_least_recently_used() -> None:
    slots = AdapterSlots(max_loras=2, max_lora_rank=16, base_model="m")
    first = slots.use(SQL)
    assert first.loads and first.adapter_id == 1 and first.evicted == ()
    slots.use(CHAT)
    again = slots.use(SQL)  # used again: now the most recent, no load
    assert not again.loads and again.adapter_id == 1
    third = slots.use(CODE)
    assert third.evicted == ("chat-lora",) and slots.loaded == ["sql-lora", "code-lora"]
    assert slots.use(CHAT).adapter_id == 2  # an adapter keeps its id across evictions
    slots.keep_only({3})  # the engine's own list wins
    assert slots.loaded == ["code-lora"]


def test_an_adapter_of_another_base_or_rank_is_refused() -> None:
    slots = AdapterSlots(max_loras=1, max_lora_rank=8, base_model="m")
    with pytest.raises(AdapterRefused, match="of 'other'"):
        slots.use(SQL.model_copy(update={"base_model": "other"}))
    with pytest.raises(AdapterRefused, match="rank 16 > max_lora_rank 8"):
        slots.use(SQL.model_copy(update={"rank": 16}))


async def drain(engine: SimEngine, request: EngineRequest) -> str:
    return "".join([out.delta async for out in engine.generate(request)])


async def test_the_sim_loads_an_adapter_once_and_a_second_evicts_the_first_under_one_slot() -> None:
    engine = SimEngine(SimConfig(model="m", speedup=1.0, max_loras=1, lora_load_ms=200.0, step_base_us=100.0))
    await engine.start()
    started = time.monotonic()
    await drain(engine, EngineRequest("r1", "hello kafka", max_tokens=2, adapter=SQL))
    loading_s = time.monotonic() - started
    started = time.monotonic()
    await drain(engine, EngineRequest("r2", "hello kafka", max_tokens=2, adapter=SQL))
    loaded_s = time.monotonic() - started
    assert loading_s >= 0.2 and loaded_s < 0.15, (loading_s, loaded_s)  # the load time is paid once
    assert engine.lora is not None and engine.lora.loaded == ["sql-lora"]
    await drain(engine, EngineRequest("r3", "hello kafka", max_tokens=2, adapter=CHAT))
    assert engine.lora.loaded == ["chat-lora"]  # slot limit 1: the first evicted
    status = build_status(
        WorkerSettings(worker_id="w", model="m"),
        engine,
        WorkerState.READY,
        "d",
        RateTracker(),
        0.0,
        cold_start_s=None,
        started_at_ms=0,
    )
    assert (status.max_loras, status.max_lora_rank, status.lora_adapters) == (1, 16, ["chat-lora"])
    await engine.stop()


async def test_the_sims_prefix_cache_keeps_an_adapters_blocks_apart() -> None:
    engine = SimEngine(SimConfig(model="m", speedup=0.0, max_loras=2))
    await engine.start()
    prompt = "the broker holds the partition offset " * 40
    await drain(engine, EngineRequest("r1", prompt, max_tokens=1))
    outs = [o async for o in engine.generate(EngineRequest("r2", prompt, max_tokens=1, adapter=SQL))]
    assert outs[-1].cached_prompt_tokens == 0  # the base model's blocks are not the adapter's
    outs = [o async for o in engine.generate(EngineRequest("r3", prompt, max_tokens=1, adapter=SQL))]
    assert outs[-1].cached_prompt_tokens > 0
    await engine.stop()


async def test_an_engine_without_slots_refuses_an_adapter() -> None:
    engine = SimEngine(SimConfig(model="m", speedup=0.0))
    assert adapter_refusal(engine, SQL) is not None and "loads no LoRA adapters" in str(adapter_refusal(engine, SQL))
    assert adapter_refusal(engine, None) is None
    await engine.start()
    with pytest.raises(RequestRejected):
        await asyncio.wait_for(drain(engine, EngineRequest("r1", "hi", max_tokens=1, adapter=SQL)), 5)
    await engine.stop()
