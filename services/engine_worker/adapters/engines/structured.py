"""OpenAI's response_format, and a named tool_choice, as vLLM's structured outputs
(SamplingParams.structured_outputs).

The same mapping as vLLM's own OpenAI server (vllm/entrypoints/generate/base/protocol.py,
structured_outputs_from_response_format): json_object → any JSON object, json_schema → JSON
following the schema; the backend (xgrammar, guidance, outlines) is the engine's `auto` choice. A named tool_choice
(`{"type": "function", "function": {"name": ...}}`) is what vLLM's server does for it too
(vllm/entrypoints/openai/chat_completion/protocol.py, _get_json_schema_from_tool): JSON following
that function's `parameters`, answered as the call's arguments.
"""

from __future__ import annotations

from typing import Any


def named_tool(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """The function definition a named tool_choice forces, None where the model chooses (or none)."""
    if not isinstance(tool_choice, dict) or tool_choice.get("type") != "function":
        return None
    name = (tool_choice.get("function") or {}).get("name")
    for tool in tools or []:
        function = tool.get("function") or {}
        if function.get("name") == name:
            return dict(function)
    raise ValueError(f"tool_choice names {name!r}, which is not among the request's tools")


def structured_outputs(response_format: dict[str, Any] | None, forced_tool: dict[str, Any] | None = None) -> Any:
    """vLLM's StructuredOutputsParams for `response_format` or a forced tool, None for free text."""
    if forced_tool is not None:
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(json=forced_tool.get("parameters") or {"type": "object"})
    if response_format is None or response_format.get("type", "text") == "text":
        return None
    from vllm.sampling_params import StructuredOutputsParams  # vLLM is imported only where it runs

    if response_format["type"] == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=response_format["json_schema"]["schema"])
