"""An upstream's SSE stream read as OpenAI's API writes it: the `data:` payloads, each choice's text,
tool call fragments, finish reason and log-probabilities."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
from pydantic import ValidationError

from llmbus.contract.messages import FinishReason, FunctionCallDelta, TokenLogprob, ToolCallDelta, TopLogprob
from llmbus_services.engine_worker.core.engine import EngineError

_KNOWN_FINISH = frozenset(r.value for r in FinishReason) - {FinishReason.ABORT, FinishReason.ERROR}


def finish_reason_of(raw: object) -> str | None:
    """An upstream's finish reason as llmbus knows it: one it does not name (a provider's own, the
    legacy `function_call`) would fail the whole answer, so it reads as "stop"."""
    if not raw:
        return None
    return str(raw) if raw in _KNOWN_FINISH else "stop"


def delta_of(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def tool_call_deltas(choice: dict[str, Any]) -> list[ToolCallDelta] | None:
    """The choice's `delta.tool_calls[]` fragments, OpenAI's fields only (a provider's extras dropped)."""
    raw = (choice.get("delta") or {}).get("tool_calls")
    if not raw:
        return None
    try:
        return [
            ToolCallDelta(
                index=int(call.get("index", position)),
                id=call.get("id"),
                type=call.get("type"),
                function=FunctionCallDelta(
                    name=(call.get("function") or {}).get("name"),
                    arguments=(call.get("function") or {}).get("arguments"),
                )
                if call.get("function")
                else None,
            )
            for position, call in enumerate(raw)
        ]
    except (ValidationError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(f"upstream sent a tool call fragment llmbus cannot read: {exc}") from exc


async def sse_data(resp: httpx.Response) -> AsyncIterator[str]:
    """The `data:` payloads of a server-sent-event stream (multi-line data joined with newlines)."""
    lines: list[str] = []
    async for line in resp.aiter_lines():
        if line == "":
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue  # comment / keep-alive
        name, _, value = line.partition(":")
        if name == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)


def choice_logprobs(raw: Any, chat: bool) -> list[TokenLogprob] | None:
    """The choice's tokens' log-probabilities in this chunk; None where it carries none."""
    if not raw:
        return None
    try:
        if chat:
            return [TokenLogprob.model_validate(entry) for entry in raw.get("content") or ()] or None
        tops = raw.get("top_logprobs") or []
        return [
            TokenLogprob(
                token=token,
                logprob=logprob if logprob is not None else -9999.0,
                top_logprobs=[TopLogprob(token=t, logprob=lp) for t, lp in (tops[i] if i < len(tops) else {}).items()],
            )
            for i, (token, logprob) in enumerate(
                zip(raw.get("tokens") or (), raw.get("token_logprobs") or (), strict=False)
            )
        ] or None
    except (ValidationError, AttributeError, TypeError, ValueError) as exc:
        raise EngineError(f"upstream sent log-probabilities llmbus cannot read: {exc}") from exc
