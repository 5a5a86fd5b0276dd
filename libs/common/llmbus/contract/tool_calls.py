"""Tool calls from their streamed fragments (OpenAI's `delta.tool_calls[]`), one rule for every reader.

A fragment names its call by `index`; the call's first fragment brings its id, type and function
name, the following ones pieces of `arguments` to concatenate. The worker assembles them for the
InferenceResult, the gateway for a non-streaming answer.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmbus.contract.messages import FunctionCall, ToolCall, ToolCallDelta


def assemble_tool_calls(deltas: Iterable[ToolCallDelta]) -> list[ToolCall]:
    """The complete calls, in index order; a call whose fragments never named it gets an empty name."""
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    arguments: dict[int, list[str]] = {}
    for delta in deltas:
        arguments.setdefault(delta.index, [])
        if delta.id:
            ids[delta.index] = delta.id
        if delta.function is not None:
            if delta.function.name:
                names[delta.index] = delta.function.name
            if delta.function.arguments:
                arguments[delta.index].append(delta.function.arguments)
    return [
        ToolCall(
            id=ids.get(index, f"call_{index}"),
            function=FunctionCall(name=names.get(index, ""), arguments="".join(arguments[index])),
        )
        for index in sorted(arguments)
    ]
