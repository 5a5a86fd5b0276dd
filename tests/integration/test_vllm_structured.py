"""OpenAI's response_format reaches the real vLLM engine as structured outputs (CPU build, tiny model).

The tiny model's weights are random: without the grammar its text is never JSON, so a JSON
answer that follows the schema can only come from vLLM's structured-output decoding.
"""

from __future__ import annotations

import json

import pytest

from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

PROMPT = "answer yes or no: does the broker keep the offsets"


async def _text(engine: VllmEngine, request: EngineRequest) -> str:
    return "".join([out.delta async for out in engine.generate(request)])


async def test_json_schema_constrains_the_answer(vllm_engine: VllmEngine) -> None:
    schema = {"type": "string", "enum": ["yes", "no"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    request = EngineRequest("json-schema-1", PROMPT, max_tokens=16, temperature=0.0, response_format=response_format)
    text = await _text(vllm_engine, request)
    # The shared test engine ignores EOS (exact lengths for the other tests), so tokens may follow
    # the finished JSON value; the value itself is the grammar's.
    value, _ = json.JSONDecoder().raw_decode(text)
    assert value in ("yes", "no"), text
    free = await _text(vllm_engine, EngineRequest("json-free-1", PROMPT, max_tokens=16, temperature=0.0))
    with pytest.raises(json.JSONDecodeError):
        json.JSONDecoder().raw_decode(free)  # the same request without the format: random text


async def test_json_object_mode_gives_an_object(vllm_engine: VllmEngine) -> None:
    request = EngineRequest(
        "json-object-1", PROMPT, max_tokens=64, temperature=0.0, response_format={"type": "json_object"}
    )
    text = await _text(vllm_engine, request)
    assert text.lstrip().startswith("{"), text  # random weights may not close it within max_tokens
