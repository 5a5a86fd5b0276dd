"""Continuing an answer on an OpenAI-compatible upstream: what a leg sends so the upstream writes on from
exactly the text its client was sent (`EngineRequest.continuation`, docs/delivery.md "Continuation across
legs"). The body is the request's own, with the answer so far added:

- a chat upstream with `continuation: continue_final_message` (vLLM, SGLang) gets it as the final assistant
  message, `continue_final_message: true` and `add_generation_prompt: false`: the chat template renders it
  open and the model writes on;
- a chat upstream with `continuation: prefix` (DeepSeek's and Mistral's chat APIs) gets it as the final
  assistant message with `prefix: true`;
- a completions upstream gets it after the prompt;
- the answer's bound is what is left of it (core/continuation.py set `max_tokens`); the sampling parameters,
  seed included, are the request's own.

A chat upstream with `continuation: none` (OpenAI's API has no assistant prefill) cannot continue an answer.
"""

from __future__ import annotations

from typing import Any

from llmbus_services.engine_worker.adapters.engines.openai_http_config import Continuation as Mode


def can_continue(mode: Mode, chat: bool) -> bool:
    """Whether an upstream of this continuation mode can take a partial answer on this API."""
    return not chat or mode != "none"


def continued_body(body: dict[str, Any], text: str, mode: Mode, chat: bool) -> None:
    """`body` (the request's own) made to continue an answer that has `text` already; in place."""
    if not text:
        return
    if not chat:
        body["prompt"] = body["prompt"] + text
    elif mode == "continue_final_message":
        body["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
        body |= {"continue_final_message": True, "add_generation_prompt": False}
    elif mode == "prefix":
        body["messages"] = [*body["messages"], {"role": "assistant", "content": text, "prefix": True}]
    else:
        raise ValueError(f"continuation {mode!r} cannot continue a chat answer")
