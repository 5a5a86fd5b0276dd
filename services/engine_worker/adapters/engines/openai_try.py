"""One try of a leg of an answer: one streamed HTTP request to one deployment, timed and read to its end.

It ends in one of two ways: its finish reason arrived (it ends with the upstream's usage, or None), or
a TryFailure says what went wrong (openai_failures.py). An answer is complete only with a finish reason:
a stream that ends without one, however cleanly, broke off. Timing counts tokens, not bytes: the first
token (text, a tool call fragment or reasoning) within `first_token_s`, then no silence between tokens
longer than `stall_s`; a keep-alive comment or a role-only event is no token. The consumer's own time
between two outputs is not counted (each read is timed alone).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import httpx

from llmbus_services.engine_worker.adapters.engines.openai_chunks import (
    choice_logprobs,
    delta_of,
    finish_reason_of,
    sse_data,
    tool_call_deltas,
)
from llmbus_services.engine_worker.adapters.engines.openai_failures import FailureKind, TryFailure, status_failure
from llmbus_services.engine_worker.core.engine import EngineError, EngineOutput


@dataclass
class TryPlan:
    """What one try sends and how long it may take."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    chat: bool
    logprobs: bool
    prompt_tokens: int  # what the upstream reads (with a continuation: the prompt and the answer so far)
    first_token_s: float
    stall_s: float
    deadline_s: float  # monotonic: the whole request's end
    model: str  # the deployment's name for the model, and the deployment: on every output
    deployment: str


@dataclass
class Tally:
    """What one engine run (a leg) streamed so far, over its tries."""

    completion_tokens: int = 0
    calls_streamed: bool = False  # a tool call fragment went out: the answer cannot be continued


@dataclass
class TryEnd:
    finish_reasons: dict[int, str]  # choice index → its finish reason
    usage: dict[str, Any] | None


@dataclass
class Opened:
    """A request's open response, for an abort to close; `aborted`: no further try may start."""

    response: httpx.Response | None = None
    aborted: bool = False

    async def abort(self) -> None:
        self.aborted = True
        if self.response is not None:
            await self.response.aclose()  # the server sees the disconnect and stops generating


async def run_try(
    client: httpx.AsyncClient, plan: TryPlan, tally: Tally, opened: Opened
) -> AsyncGenerator[EngineOutput | TryEnd, None]:
    """The try's outputs (their counts go on from `tally`'s, which they update), then its TryEnd."""
    tokens_here = 0

    def failure(kind: FailureKind, message: str) -> TryFailure:
        return TryFailure(kind, message, mid_answer=tokens_here > 0)

    request = client.build_request("POST", plan.path, json=plan.body, headers=plan.headers)
    next_token_by = time.monotonic() + plan.first_token_s
    try:
        async with asyncio.timeout(max(0.0, min(next_token_by, plan.deadline_s) - time.monotonic())):
            resp = await client.send(request, stream=True)
    except TimeoutError:
        raise failure(FailureKind.STALLED, f"no answer within {plan.first_token_s:.1f} s") from None
    except httpx.HTTPError as exc:
        raise failure(FailureKind.TRANSIENT, f"upstream unreachable: {exc!r}") from exc
    opened.response = resp
    try:
        if opened.aborted:  # while it waited for the headers
            raise failure(FailureKind.BROKEN, "aborted")
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")
            raise status_failure(resp.status_code, body, resp.headers.get("retry-after"))
        finish_reasons: dict[int, str] = {}
        usage: dict[str, Any] | None = None
        events = sse_data(resp).__aiter__()
        while True:
            wait_s = min(next_token_by, plan.deadline_s) - time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, wait_s)):
                    data = await events.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                if time.monotonic() >= plan.deadline_s:
                    raise failure(FailureKind.STALLED, "upstream took longer than the request may") from None
                gap = f"no token for {plan.stall_s:.1f} s" if tokens_here else f"no token in {plan.first_token_s:.1f} s"
                raise failure(FailureKind.STALLED, gap) from None
            if data == "[DONE]":
                continue  # read on to the end: the connection goes back to the pool
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError as exc:
                raise failure(FailureKind.BROKEN, f"upstream sent a chunk that is not JSON: {exc}") from exc
            if not isinstance(chunk, dict):
                raise failure(FailureKind.BROKEN, f"upstream sent a chunk that is not an object: {data[:100]}")
            if "error" in chunk:  # some servers report mid-stream failures as a data event
                raise failure(FailureKind.BROKEN, f"upstream error mid-stream: {str(chunk['error'])[:300]}")
            usage = chunk.get("usage") or usage
            active = bool(chunk.get("usage"))
            try:
                for out in _outputs(chunk, plan, tally, finish_reasons):
                    active = True
                    tokens_here += out.new_tokens
                    yield out
            except EngineError as exc:  # a tool call or log-probabilities llmbus cannot read
                raise failure(FailureKind.BROKEN, str(exc)) from exc
            active = active or any(_reasoning(choice) for choice in chunk.get("choices") or ())
            if active:
                next_token_by = time.monotonic() + plan.stall_s
        if 0 not in finish_reasons:
            if not tokens_here and usage is None:
                raise failure(FailureKind.TRANSIENT, "upstream answered 200 with no answer in it")
            raise failure(FailureKind.BROKEN, "upstream stream ended without a finish_reason (truncated)")
        yield TryEnd(finish_reasons, usage)
    except (httpx.StreamError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
        raise failure(FailureKind.BROKEN, f"upstream stream broke: {exc!r}") from exc
    except httpx.HTTPError as exc:
        raise failure(FailureKind.TRANSIENT, f"upstream failed: {exc!r}") from exc
    finally:
        await resp.aclose()


def _outputs(chunk: dict[str, Any], plan: TryPlan, tally: Tally, finish_reasons: dict[int, str]) -> list[EngineOutput]:
    outs = []
    for choice in chunk.get("choices") or []:
        index = int(choice.get("index") or 0)
        delta = delta_of(choice, plan.chat)
        calls = tool_call_deltas(choice) if plan.chat else None
        logprobs = choice_logprobs(choice.get("logprobs"), plan.chat) if plan.logprobs else None
        ended = finish_reason_of(choice.get("finish_reason"))
        if ended is not None:
            finish_reasons[index] = ended
        choice_ends = ended is not None and index > 0  # the first's ends the request (the engine's final output)
        if not (delta or calls or logprobs or choice_ends):
            continue
        tokens = len(logprobs) if logprobs else int(bool(delta or calls))
        tally.completion_tokens += tokens
        tally.calls_streamed = tally.calls_streamed or bool(calls)
        outs.append(
            EngineOutput(
                delta,
                tokens,
                plan.prompt_tokens,
                tally.completion_tokens,
                tool_calls=calls,
                finish_reason=ended if choice_ends else None,
                index=index,
                logprobs=logprobs,
                model=plan.model,
                deployment=plan.deployment,
            )
        )
    return outs


def _reasoning(choice: dict[str, Any]) -> bool:
    """A reasoning model's thinking (vLLM's and DeepSeek's `reasoning_content`, others' `reasoning`)."""
    delta = choice.get("delta") or {}
    return bool(delta.get("reasoning_content") or delta.get("reasoning") or choice.get("finish_reason"))
