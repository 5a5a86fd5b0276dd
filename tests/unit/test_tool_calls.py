"""Tool call fragments: assembled once for every reader, kept per attempt, shown once, in OpenAI's shape."""

from __future__ import annotations

import pytest

from llmbus.contract.chunks import ChunkAssembler, RetryDiverged, unshown_tool_calls
from llmbus.contract.messages import (
    ChatMessage,
    FinishReason,
    FunctionCall,
    FunctionCallDelta,
    InferenceRequest,
    TokenChunk,
    ToolCall,
)
from llmbus.contract.messages import ToolCallDelta as D
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus_services.engine_worker.adapters.engines.openai_body import message_body
from llmbus_services.engine_worker.adapters.engines.openai_chunks import tool_call_deltas
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher
from llmbus_services.engine_worker.core.engine import EngineRequest
from llmbus_services.gateway.core.translate import ChoiceOut, ResponseShape, finish_reason
from llmbus_services.router.core.trimming import turn_tokens
from tests.unit.test_openai_http_breaker import Clock, Upstream, engine_on


def frag(index: int, arguments: str, name: str | None = None, call_id: str | None = None) -> D:
    return D(
        index=index,
        id=call_id,
        type="function" if call_id else None,
        function=FunctionCallDelta(name=name, arguments=arguments),
    )


def test_fragments_assemble_by_index_in_order() -> None:
    deltas = [
        frag(0, "", "get_weather", "call_a"),
        frag(1, '{"b"', "get_time", "call_b"),
        frag(0, '{"city": '),
        frag(1, ": 2}"),
        frag(0, '"Paris"}'),
    ]
    assert assemble_tool_calls(deltas) == [
        ToolCall(id="call_a", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}')),
        ToolCall(id="call_b", function=FunctionCall(name="get_time", arguments='{"b": 2}')),
    ]
    assert assemble_tool_calls([]) == []


def test_upstream_deltas_are_read_with_openais_fields_only() -> None:
    choice = {
        "delta": {
            "tool_calls": [
                {"index": 1, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}, "extra": 1}
            ]
        }
    }
    assert tool_call_deltas(choice) == [
        D(index=1, id="c", type="function", function=FunctionCallDelta(name="f", arguments=""))
    ]
    assert tool_call_deltas({"delta": {"content": "hi"}}) is None


def test_an_assistant_turn_of_only_tool_calls_goes_upstream_with_null_content() -> None:
    call = ToolCall(id="c", function=FunctionCall(name="f", arguments="{}"))
    assert message_body(ChatMessage(role="assistant", tool_calls=[call]), developer_role=False) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert message_body(ChatMessage(role="tool", tool_call_id="c", content="18"), developer_role=False) == {
        "role": "tool",
        "content": "18",
        "tool_call_id": "c",
    }
    assert message_body(ChatMessage(role="user", content="hi"), developer_role=False) == {
        "role": "user",
        "content": "hi",
    }


def test_the_batcher_carries_fragments_in_its_chunks() -> None:
    batcher = ChunkBatcher("r", "t", interval_ms=1e6, max_tokens=100, model="m", clock=lambda: 0.0)
    first = batcher.add("", 1, [frag(0, "", "f", "c")])  # the first goes out at once
    assert first is not None and first.tool_calls == [frag(0, "", "f", "c")] and first.delta == ""
    assert batcher.add("", 1, [frag(0, '{"a"')]) is None
    assert batcher.add("", 1, [frag(0, ": 1}")]) is None
    rest = batcher.flush()
    assert rest is not None and rest.tool_calls == [frag(0, '{"a"'), frag(0, ": 1}")] and rest.tokens == 2
    assert batcher.flush() is None


def chunk(attempt: int, seq: int, calls: list[D] | None, final: bool = False) -> TokenChunk:
    reason = FinishReason.TOOL_CALLS if final else None
    return TokenChunk(
        request_id="r", tenant="t", seq=seq, attempt=attempt, tool_calls=calls, final=final, finish_reason=reason
    )


def test_the_assembler_keeps_the_current_attempts_fragments_and_a_retry_is_shown_once() -> None:
    assembler = ChunkAssembler()
    assembler.add(chunk(1, 0, [frag(0, "", "f", "c")]))
    assembler.add(chunk(1, 1, [frag(0, "{}")]))
    shown = list(assembler.tool_calls)
    assembler.add(chunk(2, 0, [frag(0, "", "f", "c")]))  # a retry starts again: nothing new to show yet
    assert assembler.tool_calls == [frag(0, "", "f", "c")]
    assert unshown_tool_calls(assembler.tool_calls, shown) == []
    assembler.add(chunk(2, 1, [frag(0, "{}"), frag(1, "", "g", "d")]))
    assert unshown_tool_calls(assembler.tool_calls, shown) == [frag(1, "", "g", "d")]
    with pytest.raises(RetryDiverged):
        unshown_tool_calls([frag(0, "", "other", "x")], shown)


def test_openai_shapes_of_tool_calls() -> None:
    shape = ResponseShape("chat", "r1", 0, "m")
    first = shape.stream_chunk(ChoiceOut(0, "", [frag(0, "", "f", "c")]), first=True, include_usage=False)
    assert first["choices"][0]["delta"] == {  # type: ignore[index]
        "role": "assistant",
        "content": None,
        "tool_calls": [{"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}],
    }
    later = shape.stream_chunk(ChoiceOut(0, "", [frag(0, "{}")]), first=False, include_usage=False)
    assert later["choices"][0]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}  # type: ignore[index]
    calls = [ToolCall(id="c", function=FunctionCall(name="f", arguments="{}"))]
    full = shape.full([ChoiceOut(0, "", calls, finish="tool_calls")], None)
    message = full["choices"][0]["message"]  # type: ignore[index]
    assert message["content"] is None and message["tool_calls"][0]["function"] == {"name": "f", "arguments": "{}"}
    assert "tool_calls" not in shape.full([ChoiceOut(0, "hi", finish="stop")], None)["choices"][0]["message"]  # type: ignore[index]
    assert finish_reason(FinishReason.TOOL_CALLS) == "tool_calls"


@pytest.mark.parametrize(
    ("upstream_says", "engine_says", "client_sees"),
    [
        ("tool_calls", "tool_calls", "tool_calls"),
        ("content_filter", "content_filter", "content_filter"),
        ("a_providers_own", "stop", "stop"),
    ],
)
async def test_an_upstreams_finish_reason_never_fails_the_answer(
    upstream_says: str, engine_says: str, client_sees: str
) -> None:
    upstream = Upstream()
    upstream.finish_reason = upstream_says
    engine = await engine_on(upstream, Clock())
    outs = [o async for o in engine.generate(EngineRequest("r", "hi", max_tokens=4))]
    assert outs[-1].finished and outs[-1].finish_reason == engine_says
    assert finish_reason(FinishReason(engine_says)) == client_sees
    await engine.stop()


def test_an_assistants_tool_calls_are_in_the_rendering_and_counted() -> None:
    arguments = '{"query": "' + "weather in Paris " * 50 + '"}'
    call = ToolCall(id="c", function=FunctionCall(name="lookup", arguments=arguments))
    turn = ChatMessage(role="assistant", tool_calls=[call])
    request = InferenceRequest(messages=[ChatMessage(role="user", content="hi"), turn])
    assert f"lookup({arguments})" in request.prompt_text()
    assert turn_tokens(turn) > turn_tokens(ChatMessage(role="assistant")) + 100  # the arguments count
    assert ChatMessage(role="user", content="hi").rendered() == "<|user|>\nhi\n"  # unchanged without calls
