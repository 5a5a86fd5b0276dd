"""A named tool_choice on the vLLM engine: which function it forces, and its answer as call fragments."""

from __future__ import annotations

from typing import Any

import pytest

from llmbus.contract.tool_calls import assemble_tool_calls
from services.engine_worker.adapters.engines.structured import named_tool
from services.engine_worker.adapters.engines.vllm_engine import forced_call_delta

LOOKUP_FUNCTION: dict[str, Any] = {"name": "lookup", "parameters": {"type": "object"}}
LOOKUP: dict[str, Any] = {"type": "function", "function": LOOKUP_FUNCTION}
DROP: dict[str, Any] = {"type": "function", "function": {"name": "drop"}}


def test_a_named_tool_choice_forces_that_function_and_the_others_do_not() -> None:
    forced = named_tool([DROP, LOOKUP], {"type": "function", "function": {"name": "lookup"}})
    assert forced == LOOKUP_FUNCTION
    for choice in (None, "auto", "none", "required"):
        assert named_tool([LOOKUP], choice) is None
    with pytest.raises(ValueError, match="'missing'"):
        named_tool([LOOKUP], {"type": "function", "function": {"name": "missing"}})


def test_the_generated_text_becomes_the_calls_arguments() -> None:
    function = LOOKUP_FUNCTION
    steps = [('{"par', True), ("", False), ('tition": 3}', False)]
    deltas = [d for text, first in steps for d in forced_call_delta("req-1", function, text, first) or []]
    (call,) = assemble_tool_calls(deltas)
    assert (call.id, call.function.name, call.function.arguments) == ("call_req-1", "lookup", '{"partition": 3}')
    assert forced_call_delta("req-1", None, "text", True) is None  # no forced tool: plain text
