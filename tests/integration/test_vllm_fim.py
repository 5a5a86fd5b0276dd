"""Fill-in-the-middle on the real vLLM CPU engine: a prompt with a `suffix` reaches the model as its FIM
format's tokens (the Qwen engine, Qwen2.5-Coder's sentinels); an engine with no FIM format refuses it.

The ids are those vLLM reports for the request (its RequestOutput), compared with the sentinels' ids
and the two halves tokenized by Hugging Face's tokenizer on the model's files.
"""

from __future__ import annotations

import pytest

from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest, RequestRejected, honoured_features
from tests.fixtures.vllm_prompts import PromptSpy, qwen_fim_ids

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PREFIX = "the broker holds the topic"
SUFFIX = " partition offset."


async def test_a_suffix_reaches_vllm_as_the_fim_formats_tokens(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    request = EngineRequest("fim-1", PREFIX, max_tokens=4, temperature=0.0, suffix=SUFFIX)
    outs = [o async for o in vllm_chatml_engine.generate(request)]
    expected = qwen_fim_ids(vllm_chatml_engine, PREFIX, SUFFIX)
    assert spy.prompt_ids["fim-1"] == expected
    assert outs[-1].prompt_tokens == len(expected) and outs[-1].completion_tokens == 4
    assert "suffix" in honoured_features(vllm_chatml_engine)


async def test_an_engine_without_a_fim_format_refuses_a_suffix(
    vllm_chatml_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never the prefix alone: without a format (and no renderer of vLLM's that has one) it is refused."""
    monkeypatch.setattr(vllm_chatml_engine, "_fim", None)
    assert not vllm_chatml_engine._renderer_fim  # Qwen's vLLM renderer has no FIM format of its own
    assert "suffix" not in honoured_features(vllm_chatml_engine)  # so its heartbeat does not offer it
    spy = PromptSpy(vllm_chatml_engine, monkeypatch)
    request = EngineRequest("fim-none", PREFIX, max_tokens=2, temperature=0.0, suffix=SUFFIX)
    with pytest.raises(RequestRejected, match="fill-in-the-middle"):
        [o async for o in vllm_chatml_engine.generate(request)]
    assert "fim-none" not in spy.prompt_ids  # nothing reached vLLM
