"""openai-http passes response_format, tools and suffix to the upstream as OpenAI's API names them."""

from __future__ import annotations

import pytest

from llmbus_services.engine_worker.core.engine import EngineRequest, RequestRejected
from llmbus_tools.harness.openai_server import FakeOpenAIServer
from tests.integration.test_openai_http_engine import _collect, _engine, server  # noqa: F401 - the fixture

pytestmark = pytest.mark.asyncio(loop_scope="session")

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


async def test_chat_upstream_gets_response_format_and_tools(server: FakeOpenAIServer) -> None:  # noqa: F811
    engine = await _engine(server)
    request = EngineRequest(
        "shape-1", "one two", max_tokens=3, response_format=RESPONSE_FORMAT, tools=TOOLS, tool_choice="required"
    )
    await _collect(engine, request)
    body = server.seen[-1].body
    assert (body["response_format"], body["tools"], body["tool_choice"]) == (RESPONSE_FORMAT, TOOLS, "required")
    await _collect(engine, EngineRequest("shape-2", "one two", max_tokens=3))
    assert not {"response_format", "tools", "tool_choice", "suffix"} & set(server.seen[-1].body)  # only when asked
    with pytest.raises(RequestRejected):  # fill-in-the-middle is the completions API's
        await _collect(engine, EngineRequest("shape-3", "def f(", max_tokens=3, suffix="\n    return 1"))
    await engine.stop()


async def test_completions_upstream_gets_the_suffix(server: FakeOpenAIServer) -> None:  # noqa: F811
    engine = await _engine(server, api="completions")
    await _collect(engine, EngineRequest("shape-4", "def f(", max_tokens=3, suffix="\n    return 1"))
    seen = server.seen[-1]
    assert seen.path == "/v1/completions" and seen.body["suffix"] == "\n    return 1"
    await engine.stop()
