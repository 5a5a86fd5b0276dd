"""The completion flow: an OpenAI chat or text completion -> an InferenceRequest on the bus -> its reply
chunks as a stream (SSE) or one response; the tenant from its API key, the model from the catalog."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from opentelemetry.propagate import extract
from pydantic import BaseModel, ValidationError

from llmbus.bus.span_attrs import message_attributes
from llmbus.contract.chunks import RetryDiverged
from llmbus.contract.engine_features import missing_features, refusal
from llmbus.contract.messages import InferenceRequest
from llmbus.contract.messages import Message as BusMessage
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus.security.apikeys import ApiKeyStore
from llmbus_services.gateway.adapters import metrics
from llmbus_services.gateway.adapters.catalog import ModelCatalog
from llmbus_services.gateway.adapters.key_cache import CachedKeys
from llmbus_services.gateway.adapters.relay import Exchange, Relay
from llmbus_services.gateway.adapters.sse_response import SseResponse, client_gone
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.core import errors
from llmbus_services.gateway.core.hints import BadHint, routing_hints
from llmbus_services.gateway.core.openai_types import ChatCompletionBody, CompletionBody, Unsupported
from llmbus_services.gateway.core.translate import ChoiceOut, ResponseShape, finish_reason, to_request

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.gateway")
Kind = Literal["chat", "completion"]


class Gateway:
    """What the handlers need, wired once in app.py."""

    def __init__(
        self,
        settings: GatewaySettings,
        relay: Relay,
        keys: ApiKeyStore | None,
        catalog: ModelCatalog,
        catalog_caught_up: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.keys = CachedKeys(keys, settings.api_key_cache_s) if keys is not None else None
        self.catalog = catalog
        self.catalog_caught_up = catalog_caught_up  # llm.models and llm.workers read to their end at start

    async def tenant_of(self, request: Request) -> str:
        if not self.settings.require_api_key or self.keys is None:
            return self.settings.anonymous_tenant
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise errors.unauthorized("Missing API key: send `Authorization: Bearer <key>`.")
        key = await self.keys.lookup(secret.strip())
        if key is None:
            raise errors.unauthorized()
        return key.tenant


async def read_json(request: Request, limit_bytes: int, timeout_s: float) -> dict[str, object]:
    """The body as a JSON object, within `timeout_s` (a client sending it a byte at a time holds a slot)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise errors.too_large(limit_bytes)
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for part in request.stream():
                raw += part
                if len(raw) > limit_bytes:
                    raise errors.too_large(limit_bytes)
    except TimeoutError:
        raise errors.ApiError(
            408, "The request body did not arrive in time.", "invalid_request_error", "timeout"
        ) from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.invalid(f"The body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise errors.invalid("The body must be a JSON object.")
    return data


def validation_error(exc: ValidationError) -> errors.ApiError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return errors.invalid(f"Invalid value for `{param}`: {first['msg']}", param=param)


def _parse(data: dict[str, object], model: type[BaseModel]) -> ChatCompletionBody | CompletionBody:
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from exc
    assert isinstance(body, ChatCompletionBody | CompletionBody)
    try:
        body.check_supported()
    except Unsupported as exc:
        raise errors.invalid(str(exc), param=exc.param, code="unsupported_parameter") from exc
    return body


def _check_engines_can(catalog: ModelCatalog, inference: InferenceRequest) -> None:
    """A 400 now when no live engine of the named model can honour what the request asks for.

    With `auto` the model is chosen later; the worker then refuses it the same way (a final
    invalid_request, a 400 here too)."""
    needed = inference.engine_features()
    serving = catalog.serving(inference.model) if inference.model and needed else []
    lacking = [(w.engine, missing_features(w.engine, needed, w.engine_features)) for w in serving]
    if lacking and all(missing for _, missing in lacking):
        engine, missing = min(lacking)
        raise errors.invalid(refusal(engine, inference.model or "", missing), missing[0], "unsupported_parameter")


def _fits_the_bus(gw: Gateway, message: BusMessage) -> None:
    """A 413 for what the bus would refuse (over its record limit): final, never a retryable 503."""
    limit_bytes = gw.relay.bus.settings.max_request_bytes
    if len(message.to_bytes()) > limit_bytes:
        raise errors.too_large(limit_bytes, what="The request, as llmbus carries it,")


def _admit(gw: Gateway, tenant: str) -> None:
    """This instance's slots: a 503 when all are taken, a 429 when the tenant holds its share of them."""
    if gw.relay.in_flight >= gw.settings.max_in_flight:
        raise errors.unavailable("This gateway instance is at its limit of requests in flight.", retry_after_s=1)
    if gw.relay.in_flight_of(tenant) >= gw.settings.max_in_flight_per_tenant:
        raise errors.concurrency_limited(gw.settings.max_in_flight_per_tenant)


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _sse_events(
    gw: Gateway, exchange: Exchange, shape: ResponseShape, include_usage: bool, started: float
) -> AsyncIterator[bytes]:
    """The SSE body, from the first accepted chunk (already in the assembler) to [DONE]. The first
    choice's text and log-probabilities go out as they come; a request with n > 1 has its other choices'
    parts in the same chunks, each sent as an event of its own choice index."""
    sent_first = False
    opened: set[int] = set()
    try:
        while True:
            try:
                first = ChoiceOut(0, exchange.unseen(), exchange.unseen_tool_calls(), exchange.unseen_logprobs())
                others = exchange.unseen_choices()
            except RetryDiverged as exc:
                yield _sse(errors.unavailable(f"retry could not continue the stream: {exc}").body())
                break
            for choice in ([first] if first.text or first.tool_calls else []) + others:
                if not sent_first:
                    metrics.TTFT_SECONDS.labels(shape.kind).observe(time.perf_counter() - started)
                # OpenAI's first delta of every choice says the role
                opens = choice.index not in opened
                opened.add(choice.index)
                yield _sse(shape.stream_chunk(choice, first=opens, include_usage=include_usage))
                sent_first = True
            final = exchange.assembler.final
            if final is not None:
                if final.error is not None:
                    yield _sse(errors.from_error_info(final.error).body())
                else:
                    ending = ChoiceOut(0, finish=finish_reason(final.finish_reason))
                    yield _sse(shape.stream_chunk(ending, first=0 not in opened, include_usage=include_usage))
                    if include_usage:
                        yield _sse(shape.usage_chunk(final.usage))
                yield b"data: [DONE]\n\n"
                break
            try:
                await exchange.next_chunk(gw.settings.chunk_gap_timeout_s)
            except TimeoutError:
                yield _sse(errors.ApiError(504, "no tokens within the time limit", "timeout", "timeout").body())
                break
    finally:
        exchange.close()  # cancels through llm.control unless the final chunk came
        metrics.IN_FLIGHT.dec()


async def _collect(gw: Gateway, exchange: Exchange) -> None:
    while not exchange.finished:
        try:
            await exchange.next_chunk(gw.settings.chunk_gap_timeout_s)
        except TimeoutError:  # the documented answer to a stalled request, as when streaming
            raise errors.ApiError(504, "The answer stalled past the time limit.", "timeout", "timeout") from None


async def _unless_gone(request: Request, waiting: Coroutine[Any, Any, object]) -> None:
    """Wait for `waiting`; a client that hangs up meanwhile cancels the request (and frees its slot) now."""
    task = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(client_gone(request.receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            metrics.CANCELLED.inc()
            raise errors.ApiError(499, "client closed the request", "cancelled", "cancelled")
        task.result()
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def complete(gw: Gateway, request: Request, kind: Kind) -> Response:
    started = time.perf_counter()
    request_id = request.state.request_id
    tenant = await gw.tenant_of(request)
    body = _parse(
        await read_json(request, gw.settings.max_body_bytes, gw.settings.body_timeout_s),
        ChatCompletionBody if kind == "chat" else CompletionBody,
    )
    if body.model != gw.settings.auto_model and not gw.catalog.knows(body.model):
        raise errors.model_not_found(body.model)
    try:
        hints = routing_hints(body, request.headers)
    except BadHint as exc:
        raise errors.invalid(str(exc), param=exc.header) from exc
    try:
        inference = to_request(
            body,
            request_id=request_id,
            tenant=tenant,
            reply_topic=gw.relay.reply_topic_base,
            auto_model=gw.settings.auto_model,
            hints=hints,
        )
    except ValidationError as exc:
        raise validation_error(exc) from exc
    _fits_the_bus(gw, inference)
    if not gw.relay.healthy():  # its answer could never be read: refuse now, as /ready does
        raise errors.unavailable("This gateway instance lost its reply stream.", retry_after_s=1)
    _check_engines_can(gw.catalog, inference)
    _admit(gw, tenant)
    span = tracer.start_span(
        f"{'chat' if kind == 'chat' else 'text_completion'} {body.model}",
        kind=trace.SpanKind.SERVER,
        context=extract(dict(request.headers)),  # a caller's traceparent joins its trace
        attributes=message_attributes(inference) | {"http.request.method": "POST", "url.path": request.url.path},
    )
    try:
        exchange = await gw.relay.open(inference, span)
    except Exception as exc:
        log.exception("could not publish %s", request_id)
        raise errors.unavailable("The request could not be handed to the bus.") from exc
    metrics.IN_FLIGHT.inc()
    handed_over = False
    try:
        try:
            await _unless_gone(request, exchange.next_chunk(gw.settings.first_chunk_timeout_s))
        except TimeoutError:
            raise errors.ApiError(504, "No answer started within the time limit.", "timeout", "timeout") from None
        final = exchange.assembler.final
        if final is not None and final.error is not None:
            raise errors.from_error_info(final.error)  # failed before any text: a proper HTTP status
        shape = ResponseShape(
            kind, request_id, int(time.time()), exchange.model or body.model, bool(inference.logprobs)
        )
        if body.stream:
            handed_over = True
            return SseResponse(
                _sse_events(gw, exchange, shape, body.include_usage, started),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        await _unless_gone(request, _collect(gw, exchange))
        final = exchange.assembler.final
        assert final is not None
        if final.error is not None:
            raise errors.from_error_info(final.error)
        shape.model = exchange.model or shape.model
        metrics.TTFT_SECONDS.labels(kind).observe(time.perf_counter() - started)
        assembler = exchange.assembler
        first = ChoiceOut(
            0,
            assembler.text,
            assemble_tool_calls(assembler.tool_calls) or None,
            assembler.logprobs,
            finish_reason(final.finish_reason),
        )
        others = [
            ChoiceOut(i, c.joined, assemble_tool_calls(c.calls) or None, c.logprobs, finish_reason(c.finish_reason))
            for i, c in sorted(assembler.choices.items())
        ]
        return JSONResponse(shape.full([first, *others], final.usage))
    finally:
        if not handed_over:
            exchange.close()
            metrics.IN_FLIGHT.dec()
