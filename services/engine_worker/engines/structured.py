"""OpenAI's response_format as vLLM's structured outputs (SamplingParams.structured_outputs).

The same mapping as vLLM's own OpenAI server (vllm/entrypoints/generate/base/protocol.py,
structured_outputs_from_response_format): json_object → any JSON object, json_schema → JSON
following the schema; the backend (xgrammar, guidance, outlines) is the engine's `auto` choice.
"""

from __future__ import annotations

from typing import Any


def structured_outputs(response_format: dict[str, Any] | None) -> Any:
    """vLLM's StructuredOutputsParams for `response_format`, None for free text."""
    if response_format is None or response_format.get("type", "text") == "text":
        return None
    from vllm.sampling_params import StructuredOutputsParams  # vLLM is imported only where it runs

    if response_format["type"] == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=response_format["json_schema"]["schema"])
