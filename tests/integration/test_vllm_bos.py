"""One BOS, never two: Llama 3.1's chat template writes BOS and its tokenizer adds BOS to every text it encodes.

A chat rendered to text by such a template and then encoded with the tokenizer's special tokens starts with
two BOS tokens, which the model never saw in training. The worker renders a chat through vLLM's renderer as
vLLM's OpenAI server does (template, then tokens without special tokens added), and encodes a completion
prompt with the tokenizer's BOS; the token ids vLLM reports are checked for exactly one BOS, at the start.
"""

from __future__ import annotations

import pytest

from llmbus.contract.messages import InferenceRequest
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest
from tests.fixtures.vllm_prompts import CHAT, PromptSpy, hf_tokenizer, template_ids

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]


def _bos_positions(ids: list[int], bos_id: int) -> list[int]:
    return [i for i, token in enumerate(ids) if token == bos_id]


async def test_a_chat_reaches_vllm_with_the_templates_bos_alone(
    vllm_llama31_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = vllm_llama31_engine
    tokenizer = hf_tokenizer(engine.config.model_path)
    bos = tokenizer.bos_token_id
    # The trap is there: the template writes BOS, and encoding its text with special tokens adds another.
    rendered = tokenizer.apply_chat_template(
        [m.model_dump(exclude_none=True) for m in CHAT], add_generation_prompt=True, tokenize=False
    )
    assert rendered.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert _bos_positions(tokenizer.encode(rendered), bos) == [0, 1]

    spy = PromptSpy(engine, monkeypatch)
    text = InferenceRequest(messages=CHAT).prompt_text()
    request = EngineRequest("bos-chat", text, max_tokens=4, temperature=0.0, messages=tuple(CHAT))
    outs = [out async for out in engine.generate(request)]

    sent = spy.prompt_ids["bos-chat"]
    assert _bos_positions(sent, bos) == [0]
    assert sent == template_ids(engine, CHAT)  # what Llama 3.1 Instruct was trained on
    assert outs[-1].prompt_tokens == len(sent)  # and what the worker counted and billed


async def test_a_completion_prompt_gets_the_tokenizers_bos_once(
    vllm_llama31_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = vllm_llama31_engine
    tokenizer = hf_tokenizer(engine.config.model_path)
    spy = PromptSpy(engine, monkeypatch)
    prompt = "the kafka broker keeps the offset"
    outs = [out async for out in engine.generate(EngineRequest("bos-prompt", prompt, max_tokens=2, temperature=0.0))]

    sent = spy.prompt_ids["bos-prompt"]
    assert _bos_positions(sent, tokenizer.bos_token_id) == [0]
    assert sent == tokenizer.encode(prompt)  # as vLLM's /v1/completions tokenizes a prompt
    assert engine.count_tokens(prompt) == len(sent) == outs[-1].prompt_tokens
