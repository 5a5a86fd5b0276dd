"""The `openai-http` engine: any OpenAI-compatible server (hosted providers, `vllm serve`, peers).

Streams `POST {base_url}/chat/completions` (or `/completions`) with `stream=true` and
`stream_options.include_usage`, so the last SSE chunk carries the authoritative token usage.
Per-chunk token counts are not in the protocol: each non-empty content chunk counts as one
token (what vLLM and most providers send) until the usage chunk corrects the total.
Abort closes the HTTP stream, which is how an OpenAI-compatible server learns to stop.

A chat goes to a chat API as the client sent it (every message, its role, order and fields); only
a completions API gets the chat rendered as one prompt. Repeated upstream failures open a circuit
breaker (engines/breaker.py): the worker reports DEGRADED until a probe succeeds.
Settings: engines/openai_http_config.py, documented in engines/OPENAI_HTTP.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import ValidationError

from llmbus.contract.messages import ChatMessage, FinishReason, FunctionCallDelta, ToolCallDelta
from llmbus.tokens import count_tokens
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.core.breaker import CircuitBreaker
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRejected,
    UpstreamBusy,
)

__all__ = ["OpenAIHttpConfig", "OpenAIHttpEngine", "retry_after_s"]

_KNOWN_FINISH = frozenset(r.value for r in FinishReason) - {FinishReason.ABORT, FinishReason.ERROR}
# Headers worth forwarding to the server: W3C trace context (vLLM serve and most gateways read it).
_FORWARDED_HEADERS = ("traceparent", "tracestate", "baggage")


def retry_after_s(value: str | None, default_s: float, now_s: float | None = None) -> float:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; `default_s` if absent."""
    if not value:
        return default_s
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default_s
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def _status_error(status: int, body: str, retry_after: str | None = None, cooldown_s: float = 5.0) -> EngineError:
    msg = f"upstream HTTP {status}: {body[:300]}"
    if status in (429, 503):  # rate limited / overloaded: another worker now, this one after Retry-After
        return UpstreamBusy(msg, retry_after_s(retry_after, cooldown_s))
    if status in (400, 404, 413, 422):  # the request is wrong: the same request fails everywhere
        return RequestRejected(msg)
    return EngineError(msg)


def _shape_fields(request: EngineRequest, chat: bool) -> dict[str, Any]:
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
            raise RequestRejected("suffix needs a completions upstream (this request goes to the chat API)")
        fields["suffix"] = request.suffix
    return fields


class OpenAIHttpEngine:
    name = "openai-http"

    def __init__(
        self,
        config: OpenAIHttpConfig,
        transport: httpx.AsyncBaseTransport | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.config = config
        self.breaker = breaker or CircuitBreaker(config.breaker)
        self.model = config.model
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self._transport = transport
        self._clients: list[httpx.AsyncClient] = []
        self._streams_on: list[int] = []  # streams open on each client
        self._streams: dict[str, httpx.Response | None] = {}  # request id → open response
        self._aborted: set[str] = set()
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._cached_tokens_total = 0

    async def start(self) -> None:
        """HTTP clients for max_num_seqs concurrent streams, each with a small pool kept alive.

        One client for all of them cost the worker most of its CPU at 64 streams (a CPU profile at
        c = 64, bench/reports/pipeline_profile.md): httpcore looks at every connection of its pool
        each time it places a request or one ends (O(connections) each time), and by default it
        keeps only 20 connections alive, so the streams beyond closed their connection after every
        request and opened a new one for the next. Small pools, all kept alive, fix both; a request
        goes to the client with the fewest open streams, so none waits for a connection.
        """
        if self._clients:
            return
        headers = dict(self.config.extra_headers)
        key = self.config.api_key
        if self.config.api_key_env:
            key = os.environ.get(self.config.api_key_env, "")
            if not key:
                raise EngineDead(f"environment variable {self.config.api_key_env} holds no API key")
        if key:
            bearer = self.config.api_key_header.lower() == "authorization"
            headers[self.config.api_key_header] = f"Bearer {key}" if bearer else key
        c = self.config
        per_pool = max(1, c.connections_per_pool)
        self._clients = [
            httpx.AsyncClient(
                base_url=c.base_url.rstrip("/"),
                headers=headers,
                params=c.extra_query,
                timeout=httpx.Timeout(
                    connect=c.connect_timeout_s, read=c.read_timeout_s, write=c.read_timeout_s, pool=c.connect_timeout_s
                ),
                limits=httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool),
                transport=self._transport,
            )
            for _ in range(max(1, -(-c.max_num_seqs // per_pool)))
        ]
        self._streams_on = [0] * len(self._clients)

    async def warmup(self) -> None:
        """Check the server answers; no completion is sent (a hosted one would bill it)."""
        client = self._require_client()
        try:
            resp = await client.get("/models")
        except httpx.HTTPError as exc:
            raise EngineDead(f"cannot reach {self.config.base_url}: {exc!r}") from exc
        if resp.status_code >= 500:
            raise EngineDead(f"{self.config.base_url}/models answered HTTP {resp.status_code}")

    async def stop(self) -> None:
        clients, self._clients = self._clients, []
        for resp in list(self._streams.values()):
            if resp is not None:
                await resp.aclose()
        for client in clients:
            await client.aclose()

    def _require_client(self) -> httpx.AsyncClient:
        if not self._clients:
            raise EngineDead("openai-http engine is not started")
        return self._clients[0]

    def _least_busy_client(self) -> int:
        if not self._clients:
            raise EngineDead("openai-http engine is not started")
        return min(range(len(self._clients)), key=self._streams_on.__getitem__)

    def count_tokens(self, text: str) -> int:
        return count_tokens(text, self.config.tokenizer)

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise AdmissionError(
                f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}"
            )
        if len(self._streams) >= self.max_num_seqs:
            raise AdmissionError(f"{len(self._streams)} requests in flight, max_num_seqs {self.max_num_seqs}")

    def _sends_chat(self, request: EngineRequest) -> bool:
        """Whether this request goes to /chat/completions (else /completions)."""
        if self.config.api == "auto":
            return bool(request.messages)
        return self.config.api == "chat"

    def _body(self, request: EngineRequest, chat: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.upstream_model or self.config.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
        }
        if chat and request.messages:
            # Each message with every field it has (role, content, and name / tool calls where the
            # message model carries them): the provider applies its own chat format to them. Fields
            # left at their default are not sent (an empty tool_calls is refused by some providers).
            body["messages"] = [_message_body(m) for m in request.messages]
        elif chat:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if request.seed is not None:
            body["seed"] = request.seed
        if request.stop:
            body["stop"] = list(request.stop)
        body |= _shape_fields(request, chat)
        body.update(self.config.extra_body)
        return body

    @property
    def upstream_degraded(self) -> bool:
        return self.breaker.degraded

    async def probe_upstream_if_due(self) -> None:
        """Half-open: one small request decides whether the breaker closes or stays open (longer)."""
        if not self.breaker.start_probe():
            return
        try:
            failure = await self._probe()
        except httpx.HTTPError as exc:
            failure = f"probe: {exc!r}"
        if failure is None:
            self.breaker.record_success()
        else:
            self.breaker.record_failure(failure)

    async def _probe(self) -> str | None:
        """None if the upstream answers (a 4xx, 429 or 503 too: it is there; busy has its own cooldown)."""
        client = self._require_client()
        if self.config.breaker.probe == "models":
            resp = await client.get("/models")
        else:
            chat = self.config.api != "completions"
            probe = EngineRequest("breaker-probe", "ping", max_tokens=1, temperature=0.0)
            body = self._body(probe, chat) | {"stream": False}
            body.pop("stream_options")
            resp = await client.post("/chat/completions" if chat else "/completions", json=body)
        if resp.status_code >= 500 and resp.status_code != 503:
            return f"probe: upstream HTTP {resp.status_code}: {resp.text[:200]}"
        return None

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        prompt_tokens = self.count_tokens(request.prompt)
        self.check_admission(prompt_tokens, request.max_tokens)
        if not self.breaker.allows_requests():
            raise self.breaker.refusal()
        try:
            # aclosing: a caller that stops reading closes the HTTP stream now, not when it is collected.
            async with contextlib.aclosing(self._stream(request, prompt_tokens)) as outs:
                async for out in outs:
                    if out.finished and out.finish_reason != "abort":
                        self.breaker.record_success()
                    yield out
        except (RequestRejected, UpstreamBusy, EngineDead):
            # The upstream is there (a wrong request, or busy: the Retry-After cooldown handles that),
            # or this engine is not started: no upstream failure.
            raise
        except EngineError as failed:
            self.breaker.record_failure(str(failed))
            raise

    async def _stream(self, request: EngineRequest, prompt_tokens: int) -> AsyncGenerator[EngineOutput, None]:
        slot = self._least_busy_client()
        client, open_streams = self._clients[slot], self._streams_on  # this start's: a restart makes new ones
        chat = self._sends_chat(request)
        path = "/chat/completions" if chat else "/completions"
        headers = {k: v for k, v in request.trace_headers.items() if k.lower() in _FORWARDED_HEADERS}
        headers["X-Request-Id"] = request.request_id
        completion_tokens = 0
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        deadline = time.monotonic() + self.config.request_timeout_s
        self._streams[request.request_id] = None
        open_streams[slot] += 1
        try:
            async with client.stream("POST", path, json=self._body(request, chat), headers=headers) as resp:
                self._streams[request.request_id] = resp
                if request.request_id in self._aborted:  # aborted while we waited for the headers
                    raise httpx.StreamClosed()
                if resp.status_code != 200:
                    body = (await resp.aread()).decode(errors="replace")
                    raise _status_error(
                        resp.status_code, body, resp.headers.get("retry-after"), self.config.busy_cooldown_s
                    )
                async for data in _sse_data(resp):
                    if data == "[DONE]":
                        # Not `break`: the body is read to its end, so the connection goes back to the
                        # pool (keep-alive) instead of being closed with the stream half read.
                        continue
                    if time.monotonic() > deadline:
                        raise EngineError(f"upstream took over {self.config.request_timeout_s} s")
                    chunk = json.loads(data)
                    if "error" in chunk:  # some servers report mid-stream failures as a data event
                        raise EngineError(f"upstream error mid-stream: {chunk['error']}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        delta = _delta_of(choice, chat)
                        calls = _tool_call_deltas(choice) if chat else None
                        finish_reason = _finish_reason(choice.get("finish_reason")) or finish_reason
                        if delta or calls:
                            completion_tokens += 1
                            yield EngineOutput(delta, 1, prompt_tokens, completion_tokens, tool_calls=calls)
        except EngineError:
            raise
        except (httpx.StreamError, httpx.ReadError, httpx.RemoteProtocolError) as exc:
            if request.request_id not in self._aborted:
                raise EngineError(f"upstream stream broke: {exc!r}") from exc
        except httpx.TimeoutException as exc:
            raise EngineError(f"upstream timed out: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"upstream unreachable: {exc!r}") from exc
        except json.JSONDecodeError as exc:
            raise EngineError(f"upstream sent a chunk that is not JSON: {exc}") from exc
        finally:
            open_streams[slot] -= 1
            self._streams.pop(request.request_id, None)
            aborted = request.request_id in self._aborted
            self._aborted.discard(request.request_id)

        if aborted:
            finish_reason = "abort"
        elif finish_reason is None:
            raise EngineError("upstream stream ended without a finish_reason (truncated)")
        final_completion = completion_tokens
        cached = 0
        if usage is not None:
            prompt_tokens = int(usage.get("prompt_tokens", prompt_tokens))
            final_completion = int(usage.get("completion_tokens", completion_tokens))
            cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        self._prompt_tokens_total += prompt_tokens
        self._generation_tokens_total += final_completion
        self._cached_tokens_total += cached
        yield EngineOutput(
            "",
            max(0, final_completion - completion_tokens),
            prompt_tokens,
            final_completion,
            cached_prompt_tokens=cached,
            finished=True,
            finish_reason=finish_reason,
        )

    async def abort(self, request_id: str) -> None:
        if request_id not in self._streams:
            return
        self._aborted.add(request_id)
        resp = self._streams.get(request_id)
        if resp is not None:
            await resp.aclose()  # the server sees the disconnect and stops generating

    def stats(self) -> EngineStats:
        return EngineStats(
            num_requests_running=len(self._streams),
            prompt_tokens_total=self._prompt_tokens_total,
            prefix_cache_queries_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            prefix_cache_hits_total=self._cached_tokens_total,
        )


def _finish_reason(raw: object) -> str | None:
    """An upstream's finish reason as llmbus knows it: one it does not name (a provider's own, the
    legacy `function_call`) would fail the whole answer, so it reads as "stop"."""
    if not raw:
        return None
    return str(raw) if raw in _KNOWN_FINISH else "stop"


def _message_body(message: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI's API takes it: every field it has; an assistant turn that only calls
    tools has `content: null` (what the API itself answers, and what a client sends back)."""
    body = message.model_dump(mode="json", exclude_none=True)
    if message.tool_calls and not message.content:
        body["content"] = None
    return body


def _delta_of(choice: dict[str, Any], chat: bool) -> str:
    if chat:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


def _tool_call_deltas(choice: dict[str, Any]) -> list[ToolCallDelta] | None:
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


async def _sse_data(resp: httpx.Response) -> AsyncIterator[str]:
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
