"""Tool calling end to end: the official `openai` SDK through the gateway, the real broker and Redis,
to openai-http workers whose upstream (llmbus_tools/harness/openai_server.py) answers `tool_choice:
required` with a streamed call of every tool asked for.

Checked, streaming and not: the upstream's tool calls (ids, names, arguments pieced together from
its fragments) come back in OpenAI's shape with `finish_reason: tool_calls`; the follow-up that
carries the assistant's tool calls and the `tool` results reaches the upstream as the client sent it.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from llmbus.client import TopicTail, collect_results
from llmbus.contract import topics as t
from llmbus.contract.messages import FinishReason
from tests.integration.test_openai_http_worker import (  # noqa: F401 - `hosted` is the fixture
    MODEL,
    HostedStack,
    arrived_with,
    hosted,
    sdk,
)

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]


async def _ask_for_tools(stack: HostedStack, messages: Any, stream: bool) -> tuple[list[Any], str]:
    """The answer's tool calls as (id, name, arguments) and its finish reason."""
    client = sdk(stack)
    if not stream:
        done = await client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            tool_choice="required",
            max_tokens=64,
        )
        message = done.choices[0].message
        assert message.content is None  # OpenAI's shape: only tool calls, no text
        calls = [
            (c.id, c.function.name, c.function.arguments) for c in message.tool_calls or [] if c.type == "function"
        ]
        return calls, done.choices[0].finish_reason
    # Pieced together from the deltas as the SDK's users do (the SDK's own `stream` helper does the same).
    by_index: dict[int, dict[str, str]] = {}
    finish = ""
    async for chunk in await client.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=64,
        stream=True,
    ):
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = by_index.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return [(c["id"], c["name"], c["arguments"]) for _, c in sorted(by_index.items())], finish


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_come_back_and_the_tool_results_reach_the_upstream(hosted: HostedStack, stream: bool) -> None:  # noqa: F811
    marker = uuid.uuid4().hex
    question = f"What is the weather in Paris, and the time? ({marker})"
    messages: Any = [{"role": "user", "content": question}]

    calls, finish = await _ask_for_tools(hosted, messages, stream)

    [seen] = arrived_with(hosted, marker)
    assert seen.body["tools"] == TOOLS and seen.body["tool_choice"] == "required"
    request_id = seen.headers["x-request-id"]
    arguments = json.dumps({"query": question})  # what the upstream streamed, in 5-character pieces
    assert calls == [
        (f"call_{request_id[:8]}_0", "get_weather", arguments),
        (f"call_{request_id[:8]}_1", "get_time", arguments),
    ]
    assert finish == "tool_calls"

    follow_up: Any = [
        *messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                for call_id, name, args in calls
            ],
        },
        {"role": "tool", "tool_call_id": calls[0][0], "content": "18 °C, sunny"},
        {"role": "tool", "tool_call_id": calls[1][0], "content": "14:05"},
    ]
    client = sdk(hosted)
    if stream:
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model=MODEL,
                messages=follow_up,
                tools=TOOLS,
                max_tokens=4,
                stream=True,
            )
        ]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert reasons == ["length"]
    else:
        done = await client.chat.completions.create(
            model=MODEL,
            messages=follow_up,
            tools=TOOLS,
            max_tokens=4,
        )
        text = done.choices[0].message.content or ""
        assert done.choices[0].message.tool_calls is None and done.choices[0].finish_reason == "length"
    assert text == " w0 w1 w2 w3"  # the upstream's text answer to the tool results

    [first, second] = arrived_with(hosted, marker)
    assert first is seen
    assert second.body["messages"] == follow_up  # the tool calls and results exactly as the client sent them


async def test_the_result_on_llm_results_carries_the_assembled_tool_calls(hosted: HostedStack) -> None:  # noqa: F811
    marker = uuid.uuid4().hex
    results = await TopicTail(hosted.settings, t.Topics(hosted.settings.topic_prefix).name(t.RESULTS)).start()
    try:
        raw = await sdk(hosted).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Time? ({marker})"}],
            tools=TOOLS[1:],
            tool_choice="required",
            max_tokens=64,
        )
        request_id = raw.headers["x-request-id"]
        found = await collect_results(hosted.settings, {request_id}, timeout_s=5, tail=results)
    finally:
        await results.stop()
    [result] = found[request_id]
    assert result.finish_reason == FinishReason.TOOL_CALLS and result.text == ""
    assert [(c.function.name, json.loads(c.function.arguments)) for c in result.tool_calls or []] == [
        ("get_time", {"query": f"Time? ({marker})"})
    ]

    # The idiom of the SDK's docs: the answer's message object itself goes back in the next turn.
    message = raw.parse().choices[0].message
    [call] = message.tool_calls or []
    await sdk(hosted).chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": f"Time? ({marker})"},
            message,
            {"role": "tool", "tool_call_id": call.id, "content": "14:05"},
        ],
        tools=TOOLS[1:],
        max_tokens=2,
    )
    [_, follow_up] = arrived_with(hosted, marker)
    assert follow_up.body["messages"][1:] == [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(mode="json")]},
        {"role": "tool", "content": "14:05", "tool_call_id": call.id},
    ]
