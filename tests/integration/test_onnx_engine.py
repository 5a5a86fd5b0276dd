"""The `onnx` engine on ONNX Runtime: the tiny Llama exported to ONNX here (onnxruntime-genai's model builder),
its greedy answer token for token the same as the PyTorch model's (Hugging Face's generate), streamed one token
per step, a chat rendered by the model's template, stop strings, aborts, and the admission limits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from llmbus.contract.messages import ChatMessage
from llmbus_services.engine_worker.adapters.engines.onnx_engine import OnnxConfig, OnnxEngine
from llmbus_services.engine_worker.core.engine import AdmissionError, EngineRequest
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.tiny_onnx import export_tiny_onnx

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.asyncio(loop_scope="session")]

PROMPT = "the kafka broker holds the topic partition"


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export_tiny_onnx(build_tiny_llama(), tmp_path_factory.mktemp("onnx") / "tiny-llama-onnx")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(onnx_dir: Path) -> AsyncIterator[OnnxEngine]:
    onnx = OnnxEngine(OnnxConfig(model="tiny-onnx", model_path=str(onnx_dir), max_num_seqs=2, ignore_eos=True))
    await onnx.start()
    await onnx.warmup()
    yield onnx
    await onnx.stop()


def torch_greedy(prompt_ids: list[int], new_tokens: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_llama(), dtype=torch.float32)
    out = model.generate(
        torch.tensor([prompt_ids]), max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
    )
    return [int(i) for i in out[0][len(prompt_ids) :]]


async def test_the_greedy_answer_is_the_pytorch_models_token_for_token(engine: OnnxEngine) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(build_tiny_llama())
    prompt_ids = engine._encode(PROMPT)
    assert prompt_ids == tokenizer.encode(PROMPT, add_special_tokens=False)  # the same tokenizer
    outs = [o async for o in engine.generate(EngineRequest("g1", PROMPT, max_tokens=12, temperature=0.0))]
    assert [o.new_tokens for o in outs] == [1] * 12  # streamed: one token per step
    assert outs[-1].finished and outs[-1].finish_reason == "length" and outs[-1].completion_tokens == 12
    assert outs[-1].prompt_tokens == len(prompt_ids)
    expected = torch_greedy(prompt_ids, 12)
    assert "".join(o.delta for o in outs) == tokenizer.decode(expected, skip_special_tokens=True)


async def test_a_chat_is_rendered_by_the_models_template(engine: OnnxEngine) -> None:
    from transformers import AutoTokenizer

    messages = [ChatMessage(role="user", content="which broker holds the partition?")]
    tokenizer = AutoTokenizer.from_pretrained(build_tiny_llama())
    expected = tokenizer.apply_chat_template(
        [m.model_dump(exclude_none=True) for m in messages], add_generation_prompt=True, tokenize=False
    )
    request = EngineRequest("c1", "unused", max_tokens=3, temperature=0.0, messages=tuple(messages))
    outs = [o async for o in engine.generate(request)]
    assert outs[-1].prompt_tokens == len(tokenizer.encode(expected, add_special_tokens=False))


async def test_a_stop_string_ends_the_answer_before_it(engine: OnnxEngine) -> None:
    full = "".join([o.delta async for o in engine.generate(EngineRequest("s1", PROMPT, max_tokens=10, temperature=0))])
    stop = full[3:6]
    assert stop.strip()
    outs = [o async for o in engine.generate(EngineRequest("s2", PROMPT, max_tokens=10, temperature=0, stop=(stop,)))]
    assert "".join(o.delta for o in outs) == full[: full.index(stop)]
    assert outs[-1].finish_reason == "stop"


async def test_abort_ends_the_stream_and_admission_refuses_past_the_window_and_the_batch(engine: OnnxEngine) -> None:
    seen: list[str] = []

    async def long_one() -> None:
        async for out in engine.generate(EngineRequest("a1", PROMPT, max_tokens=400, temperature=0)):
            seen.append(out.finish_reason or "")

    task = asyncio.create_task(long_one())
    while not seen:
        await asyncio.sleep(0.01)
    await engine.abort("a1")
    await asyncio.wait_for(task, 30)
    assert seen[-1] == "abort" and len(seen) < 400
    with pytest.raises(AdmissionError, match="max_model_len"):
        engine.check_admission(engine.max_model_len, 1)
    engine._running |= {"x": 100, "y": 20}  # two generating: the batch of this engine (max_num_seqs 2) is full
    try:
        with pytest.raises(AdmissionError, match="max_num_seqs 2"):
            engine.check_admission(10, 10)
        busy = engine.stats()  # each generator's KV cache holds its whole length: 7 + 2 blocks of 16 tokens
        assert (busy.kv_blocks_total, busy.kv_blocks_free) == (2 * engine.max_model_len // 16, busy.kv_blocks_total - 9)
    finally:
        for rid in ("x", "y"):
            engine._running.pop(rid)
    idle = engine.stats()
    assert idle.num_requests_running == 0 and idle.kv_blocks_free == idle.kv_blocks_total
    assert idle.generation_tokens_total > 0
