"""The next leg of a cut answer, as the engine takes it (pure; docs/delivery.md, "Continuation across legs").

One mechanism for every cut: a worker that continues a request after a death, a drain or an OOM
elsewhere builds the Continuation from the reply topic (adapters/continuation_read.py); an engine
that ends a leg with LegCut(in_process=True) gets it built from the worker's own stream. Either way
the engine's request is `continued(request, continuation)`: the same prompt and sampling parameters
(seed included), the answer so far to continue, what is left of max_tokens.

What an engine does with it: the sim continues its answer's token stream; vLLM reads the prompt's
token ids (chat template with the generation prompt) followed by the answer so far, tokenized, and
generates what follows (its detokenizer is primed with those ids, so the first new word keeps its
space); an openai-http upstream gets the partial answer as the final assistant message, where its
settings say it continues one (OPENAI_HTTP.md, `continuation`).
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from llmbus.contract.messages import Continuation
from llmbus_services.engine_worker.core.engine import EngineRequest


class ContinuingEngine(Protocol):
    def can_continue(self, request: EngineRequest) -> bool: ...


def continuable(request: EngineRequest) -> str | None:
    """Why no engine can continue `request`'s answer mid-stream (None: it can be): its next attempt then
    starts the answer again, as the chunk contract's restart rule says."""
    if request.n > 1:
        return "n > 1: each choice would need its own continuation"
    if request.response_format is not None and request.response_format.get("type") not in (None, "text"):
        return "response_format: the grammar would start again from the continued text"
    if request.tools and request.tool_choice not in (None, "none", "auto"):
        return "tool_choice: a forced tool call is one structured answer"
    return None


def can_continue(engine: object, request: EngineRequest) -> bool:
    """Whether `engine` can run `request` as the next leg of its answer: the request allows it and the
    engine says it can (the sim and vLLM; an openai-http upstream set up for it)."""
    check = getattr(engine, "can_continue", None)
    return continuable(request) is None and check is not None and bool(check(request))


def remaining_tokens(request: EngineRequest, continuation: Continuation) -> int:
    """What is left of the request's max_tokens (an unset one: of the output cap it stands for)."""
    return request.max_tokens - continuation.completion_tokens


def continued(request: EngineRequest, continuation: Continuation) -> EngineRequest:
    """The engine's request for the next leg: the same request, continuing `continuation`'s text, with
    the rest of max_tokens (at least 1: the caller ends an answer with none left without the engine)."""
    left = max(1, remaining_tokens(request, continuation))
    return dataclasses.replace(request, continuation=continuation, max_tokens=left)
