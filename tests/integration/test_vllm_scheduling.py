"""Real vLLM scheduling through the engine: the request's priority reaches vLLM's scheduler, a
preemption is reported on the request it hit, and the warm-up plan runs what it says.

`vllm_chatml_engine` has a KV cache of four 128-token blocks (one max_model_len sequence) and
two sequences: two requests that both grow to four blocks cannot both stay, and vLLM's priority
policy evicts the one with the larger priority value (the less urgent one).
"""

from __future__ import annotations

import asyncio

import pytest

from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest
from tests.fixtures.vllm_engine import CHATML_KV_BLOCKS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


async def _run(engine: VllmEngine, request: EngineRequest, done: list[str]) -> list[EngineOutput]:
    outs = [o async for o in engine.generate(request)]
    done.append(request.request_id)
    return outs


async def test_the_less_urgent_request_is_preempted_and_says_so(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = vllm_chatml_engine
    assert engine.stats().kv_blocks_total - 1 == CHATML_KV_BLOCKS, engine.stats()  # and the null block
    # Both are let in (our admission would keep the second out once the first holds the cache):
    # what is tested here is vLLM's choice under pressure, and that it reaches the result.
    monkeypatch.setattr(engine, "check_admission", lambda prompt_tokens, max_tokens: None)
    prompt_ids = {"lazy": "the kafka broker " * 30, "urgent": "the gpu node memory " * 25}
    done: list[str] = []
    # The less urgent one arrives first: first-come-first-served would evict the urgent one.
    lazy = asyncio.create_task(
        _run(engine, EngineRequest("prio-lazy", prompt_ids["lazy"], max_tokens=380, temperature=0.0, priority=9), done)
    )
    await asyncio.sleep(0)
    urgent = await _run(
        engine, EngineRequest("prio-urgent", prompt_ids["urgent"], max_tokens=380, temperature=0.0, priority=0), done
    )
    lazy_outs = await lazy

    assert urgent[-1].completion_tokens == 380 == lazy_outs[-1].completion_tokens
    assert urgent[-1].preemptions == 0
    assert lazy_outs[-1].preemptions >= 1
    assert done == ["prio-urgent", "prio-lazy"]
    assert engine.stats().num_preemptions_total >= lazy_outs[-1].preemptions


async def test_the_warmup_plan_runs_its_iterations_of_dummy_tokens(vllm_chatml_engine: VllmEngine) -> None:
    engine = vllm_chatml_engine
    before = engine.stats()
    await engine.warmup()
    after = engine.stats()

    iterations, tokens = engine.config.warmup_iterations, engine.config.warmup_prompt_tokens
    assert after.prompt_tokens_total - before.prompt_tokens_total == iterations * tokens
    phases = engine.cold_start_phases_s
    assert list(phases) == ["import", "config", "engine_process", "weights", "kv_pool", "kernels", "warmup"]
    # vLLM was imported before (~0 s); the CPU build warms its kernels up inside the memory profile (~0 s).
    assert all(v > 0 for k, v in phases.items() if k not in ("import", "kernels"))
