"""The body of an `openai-http` request: the chat as sent (or the prompt), the parameters the request
sets and nothing it leaves unset, its shape (response_format, tools, suffix)."""

from __future__ import annotations

from typing import Any

from llmbus.contract.messages import ChatMessage
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.core.engine import EngineRequest, RequestRejected

# The request's parameters sent as OpenAI's API (and vLLM's server, for its extras) names them, when set.
_PASSED: tuple[str, ...] = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "logit_bias")
_PASSED += ("reasoning_effort", "top_k", "min_p", "repetition_penalty")


def parameters(request: EngineRequest, chat: bool, max_tokens_param: str) -> dict[str, Any]:
    """What the request sets, and nothing it leaves unset (the upstream's defaults apply to those, as
    when a client calls it directly). An unset max_tokens sends no bound: the upstream's own applies."""
    fields: dict[str, Any] = {name: value for name in _PASSED if (value := getattr(request, name)) is not None}
    if not request.max_tokens_auto:
        fields[max_tokens_param if chat else "max_tokens"] = request.max_tokens
    if request.n > 1:
        fields["n"] = request.n
    if request.logprobs:
        # The chat API's logprobs is a flag with top_logprobs beside it; the completions API's the count.
        if chat:
            fields |= {"logprobs": True, "top_logprobs": request.top_logprobs or 0}
        else:
            fields["logprobs"] = request.top_logprobs or 0
    if request.parallel_tool_calls is not None and request.tools:
        fields["parallel_tool_calls"] = request.parallel_tool_calls
    if request.reasoning_effort is not None and not chat:
        raise RequestRejected("reasoning_effort needs a chat upstream", "reasoning_effort")
    return fields


def shape_fields(request: EngineRequest, chat: bool) -> dict[str, Any]:
    """The request's response_format, tools and suffix, as OpenAI's API names them."""
    fields: dict[str, Any] = {}
    if request.response_format is not None:
        fields["response_format"] = request.response_format
    if request.tools:
        fields["tools"] = request.tools
        if request.tool_choice is not None:
            fields["tool_choice"] = request.tool_choice
    if request.suffix is not None:
        if chat:  # only the completions API has fill-in-the-middle
            raise RequestRejected("suffix needs a completions upstream (this request goes to the chat API)", "suffix")
        fields["suffix"] = request.suffix
    return fields


def request_body(request: EngineRequest, chat: bool, config: OpenAIHttpConfig) -> dict[str, Any]:
    """The upstream request's JSON: the chat (or prompt), the parameters the request sets, its shape."""
    body: dict[str, Any] = {
        "model": config.upstream_model or config.model,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat and request.messages:
        # Each message with every field it has (role, content, and name / tool calls where the
        # message model carries them): the provider applies its own chat format to them. Fields
        # left at their default are not sent (an empty tool_calls is refused by some providers).
        body["messages"] = [message_body(m, config.developer_role) for m in request.messages]
    elif chat:
        body["messages"] = [{"role": "user", "content": request.prompt}]
    elif any(m.images for m in request.messages):
        raise RequestRejected("image_url needs a chat upstream (this one takes a prompt)", "image_url")
    else:
        body["prompt"] = request.prompt
    if request.stop:
        body["stop"] = list(request.stop)
    body |= parameters(request, chat, config.max_tokens_param)
    body |= shape_fields(request, chat)
    if config.prompt_cache == "salted" and request.cache_salt:
        body["cache_salt"] = request.cache_salt  # the upstream's prefix cache keyed per tenant (vLLM's server)
    body.update(config.extra_body)
    return body


def message_body(message: ChatMessage, developer_role: bool) -> dict[str, Any]:
    """A message as OpenAI's API takes it: every field it has; content parts (images) as the content; an
    assistant turn that only calls tools has `content: null` (what the API itself answers, and what a
    client sends back); a `developer` turn as `system` unless the upstream takes the role."""
    body = message.model_dump(mode="json", exclude_none=True, exclude={"content_parts"})
    if message.content_parts:
        body["content"] = [part.model_dump(mode="json", exclude_none=True) for part in message.content_parts]
    if message.tool_calls and not message.content:
        body["content"] = None
    if message.role == "developer" and not developer_role:
        body["role"] = "system"
    return body
