"""A dispatch as the engine takes it (pure): the request's prompt, its parameters as set, its tokenizer."""

from __future__ import annotations

from llmbus.contract.messages import Dispatch
from llmbus_services.engine_worker.core.engine import EngineRequest


def engine_request(dispatch: Dispatch, trace_headers: dict[str, str]) -> EngineRequest:
    """The engine's request for one dispatch. Unset parameters stay unset (None): the engine applies the
    model's own defaults. The engine's id is the request key (tenant and request id): unique on a worker."""
    routed = dispatch.routed
    request = routed.request
    return EngineRequest(
        request_id=request.request_key,
        prompt=request.prompt_text(),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=tuple(request.stop),
        priority=request.priority,
        response_format=request.response_format.model_dump(exclude_none=True) if request.response_format else None,
        tools=request.tools,
        tool_choice=request.tool_choice,
        suffix=request.suffix,
        trace_headers=trace_headers,
        messages=tuple(request.messages) if request.prompt is None else (),
        max_tokens_auto=bool(request.max_tokens_auto),
        n=request.choices,
        logprobs=bool(request.logprobs),
        top_logprobs=request.top_logprobs if request.logprobs else None,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        logit_bias=request.logit_bias,
        parallel_tool_calls=request.parallel_tool_calls,
        reasoning_effort=request.reasoning_effort,
        top_k=request.top_k,
        min_p=request.min_p,
        repetition_penalty=request.repetition_penalty,
        tokenizer=routed.prompt_tokenizer,
        cache_salt=routed.cache_salt,
        adapter=routed.adapter,
    )
