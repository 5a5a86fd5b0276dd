"""The real vLLM engine (the CPU build here, the GPU build in make gpu-check; tiny random-weight Llama): streaming,
abort, admission, failure."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from llmbus.contract.messages import ErrorCode, InferenceRequest, RoutedRequest
from llmbus_services.engine_worker.adapters.engines import vllm_phases
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine, classify_error
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOOM,
    EngineOutput,
    EngineRequest,
)
from llmbus_tools.harness.vllm_config import TINY_MAX_MODEL_LEN

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PROMPT = "the kafka broker keeps the topic partition offset for each consumer"


async def _collect(engine: VllmEngine, request: EngineRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


async def _final_only_text(engine: VllmEngine, prompt: str, max_tokens: int) -> tuple[str, int]:
    """The same greedy request through vLLM directly, asking only for the final output."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm = engine._llm
    ids = engine._tokenizer.encode(prompt)
    (engine_input,) = llm.renderer.render_cmpl([{"prompt_token_ids": ids}])
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    final = None
    async for out in llm.generate(engine_input, params, "reference-final-only"):
        final = out
    assert final is not None
    return final.outputs[0].text, len(final.outputs[0].token_ids)


async def test_stream_deltas_concatenate_to_the_final_text(vllm_engine: VllmEngine) -> None:
    before = vllm_engine.stats()
    outs = await _collect(vllm_engine, EngineRequest("stream-1", PROMPT, max_tokens=24, temperature=0.0))

    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert not any(o.finished for o in outs[:-1])
    # Cumulative counts; vLLM merges deltas the consumer has not picked up yet, so one output
    # may carry several tokens.
    running_total = 0
    for o in outs:
        running_total += o.new_tokens
        assert o.new_tokens >= 1 and o.completion_tokens == running_total
    assert running_total == 24
    assert all(o.prompt_tokens == vllm_engine.count_tokens(PROMPT) for o in outs)
    text, n_tokens = await _final_only_text(vllm_engine, PROMPT, 24)
    assert "".join(o.delta for o in outs) == text
    assert n_tokens == 24

    after = vllm_engine.stats()
    assert after.generation_tokens_total - before.generation_tokens_total == 48  # ours + the reference
    assert after.prompt_tokens_total - before.prompt_tokens_total == 2 * vllm_engine.count_tokens(PROMPT)
    assert after.num_requests_running == 0 and after.kv_blocks_total > 0


async def test_concurrent_requests_are_batched_and_the_excess_waits(vllm_engine: VllmEngine) -> None:
    n = vllm_engine.max_num_seqs + 4  # 4 more than vLLM runs at once
    reqs = [EngineRequest(f"conc-{i}", f"{PROMPT} {i}", max_tokens=24, temperature=0.8, seed=i) for i in range(n)]
    seen: list[tuple[int, int]] = []
    backlogs: list[int] = []

    async def run(req: EngineRequest) -> list[EngineOutput]:
        outs = []
        async for out in vllm_engine.generate(req):
            stats = vllm_engine.stats()
            seen.append((stats.num_requests_running, stats.num_requests_waiting))
            backlogs.append(stats.prefill_backlog_tokens)
            outs.append(out)
        return outs

    results = await asyncio.gather(*(run(r) for r in reqs))
    assert [r[-1].completion_tokens for r in results] == [24] * n
    assert max(running for running, _ in seen) == vllm_engine.max_num_seqs  # batched, up to the limit
    assert max(waiting for _, waiting in seen) >= 1  # the rest queued inside vLLM
    # while the first batch decodes, the 4 waiting prompts are the engine's prefill backlog (the heartbeat's)
    assert max(backlogs) >= 4 * vllm_engine.count_tokens(PROMPT)
    assert vllm_engine.stats().num_requests_running == 0 and vllm_engine.stats().prefill_backlog_tokens == 0


async def test_abort_mid_stream_ends_with_abort(vllm_engine: VllmEngine) -> None:
    outs = []
    async for out in vllm_engine.generate(EngineRequest("abort-1", PROMPT, max_tokens=400, temperature=0.0)):
        outs.append(out)
        if len(outs) == 3:
            await vllm_engine.abort("abort-1")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"
    assert outs[-1].completion_tokens < 400
    assert vllm_engine.stats().num_requests_running == 0
    assert vllm_engine._llm.get_num_unfinished_requests() == 0


async def test_closing_the_stream_aborts_in_vllm(vllm_engine: VllmEngine) -> None:
    gen = vllm_engine.generate(EngineRequest("close-1", PROMPT, max_tokens=400, temperature=0.0))
    await gen.__anext__()
    await gen.aclose()
    await asyncio.sleep(0.2)
    assert vllm_engine._llm.get_num_unfinished_requests() == 0


async def test_over_capacity_is_refused_before_vllm_sees_it(vllm_engine: VllmEngine, monkeypatch) -> None:
    prompt_tokens = vllm_engine.count_tokens(PROMPT)
    with pytest.raises(AdmissionError, match="max_model_len"):
        await _collect(vllm_engine, EngineRequest("too-long", PROMPT, max_tokens=TINY_MAX_MODEL_LEN))
    vllm_engine.check_admission(prompt_tokens, TINY_MAX_MODEL_LEN - prompt_tokens)  # exactly full: fine

    # KV: pretend vLLM reported a full cache (0 blocks free, however many the platform allocated).
    monkeypatch.setattr(vllm_engine._sink, "kv_cache_usage", 1.0)
    with pytest.raises(AdmissionError, match="KV blocks"):
        vllm_engine.check_admission(prompt_tokens, 16)


async def test_prefix_cache_hits_on_a_repeated_long_prompt(vllm_engine: VllmEngine) -> None:
    long_prompt = " ".join(f"{PROMPT} part{i}" for i in range(12))  # > 2 blocks of 128 tokens
    assert vllm_engine.count_tokens(long_prompt) > 2 * vllm_engine.stats().kv_block_size
    before = vllm_engine.stats()
    first = await _collect(vllm_engine, EngineRequest("prefix-1", long_prompt, max_tokens=2, temperature=0.0))
    second = await _collect(vllm_engine, EngineRequest("prefix-2", long_prompt, max_tokens=2, temperature=0.0))
    after = vllm_engine.stats()
    assert first[-1].cached_prompt_tokens == 0
    assert second[-1].cached_prompt_tokens >= 2 * after.kv_block_size
    assert after.prefix_cache_hits_total - before.prefix_cache_hits_total == second[-1].cached_prompt_tokens


async def test_a_tenant_gets_no_cached_tokens_on_another_tenants_prefix(vllm_engine: VllmEngine) -> None:
    """vLLM's per-request cache_salt, one per tenant (RoutedRequest.cache_salt): tenant B's guess of
    tenant A's prompt shows cached_tokens 0, while A's own repeat hits and a cache group shares."""

    def salt(tenant: str, group: str | None = None) -> str:
        request = InferenceRequest(request_id="s", tenant=tenant, prompt="s")
        return RoutedRequest(request=request, model="tiny", cache_group=group).cache_salt

    secret = " ".join(f"{PROMPT} acme-internal-{i}" for i in range(12))  # > 2 blocks of 128 tokens
    block = vllm_engine.stats().kv_block_size

    async def cached(request_id: str, cache_salt: str) -> int:
        request = EngineRequest(request_id, secret, max_tokens=2, temperature=0.0, cache_salt=cache_salt)
        return (await _collect(vllm_engine, request))[-1].cached_prompt_tokens

    assert await cached("salt-acme-1", salt("acme")) == 0
    assert await cached("salt-acme-2", salt("acme")) >= 2 * block
    assert await cached("salt-globex-1", salt("globex")) == 0, "globex sees that acme sent this prompt"
    assert await cached("salt-unsalted", "") == 0  # nor does a request without a salt
    assert await cached("salt-group-a", salt("acme", "corp")) == 0
    assert await cached("salt-group-b", salt("acme-eu", "corp")) >= 2 * block  # one cache group: shared


async def test_the_engine_cores_start_is_split_as_vllms_workers_timed_it(vllm_engine: VllmEngine) -> None:
    llm = vllm_engine._llm
    # vLLM resolved the worker class to the timed subclass of the platform's (CPUWorker here, Worker on a GPU)
    worker_cls = llm.vllm_config.parallel_config.worker_cls
    assert worker_cls in {f"{vllm_phases.__name__}.TimedCpuWorker", f"{vllm_phases.__name__}.TimedGpuWorker"}
    phases = vllm_engine.cold_start_phases_s
    assert list(phases) == ["import", "config", "engine_process", "weights", "kv_pool", "kernels", "warmup"]
    assert phases["weights"] > 0 and phases["kv_pool"] > 0 and phases["engine_process"] > 0
    assert sum(v for k, v in phases.items() if k != "warmup") == pytest.approx(vllm_engine.cold_start_s, abs=0.05)
    # Asked again, each rank answers what it measured while the engine started (one rank here)
    [rank] = await llm.collective_rpc(vllm_phases.RPC_METHOD)
    assert {k: round(v, 3) for k, v in rank.items()} == {k: phases[k] for k in ("weights", "kv_pool", "kernels")}
    # What the heartbeat reports is what vLLM resolved, not the settings (which may be unset)
    assert (vllm_engine.max_model_len, vllm_engine.max_num_seqs) == (
        llm.model_config.max_model_len,
        llm.vllm_config.scheduler_config.max_num_seqs,
    )


async def test_engine_core_death_becomes_engine_dead_and_restart_recovers(vllm_engine: VllmEngine) -> None:
    # Last in the file: it kills the shared engine and leaves it restarted.
    core_pid = vllm_engine._llm.engine_core.resources.engine_manager.processes[0].pid
    outs = []
    with pytest.raises(EngineDead):
        async for out in vllm_engine.generate(EngineRequest("doomed", PROMPT, max_tokens=400, temperature=0.0)):
            outs.append(out)
            if len(outs) == 2:
                os.kill(core_pid, signal.SIGKILL)
    assert len(outs) < 400
    assert vllm_engine.dead
    with pytest.raises(EngineDead):
        await _collect(vllm_engine, EngineRequest("after-death", PROMPT, max_tokens=2))

    await vllm_engine.restart()
    assert not vllm_engine.dead
    outs = await _collect(vllm_engine, EngineRequest("reborn", PROMPT, max_tokens=8, temperature=0.0))
    assert outs[-1].completion_tokens == 8 and outs[-1].finish_reason == "length"


async def test_error_classification() -> None:
    import torch
    from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

    assert isinstance(classify_error(EngineDeadError()), EngineDead)
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as oom:
            raise EngineGenerateError() from oom
    except EngineGenerateError as wrapped:
        assert isinstance(classify_error(wrapped), EngineOOM)
    plain = classify_error(EngineGenerateError())
    assert type(plain) is EngineError and plain.code == ErrorCode.ENGINE_FAILED
