"""The OpenAI-compatible HTTP surface (FastAPI): thin handlers over the relay, keys and catalog."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.propagate import extract
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmbus.bus.span_attrs import message_attributes
from llmbus.contract import topics as t
from llmbus.contract.chunks import RetryDiverged
from llmbus.contract.engine_features import missing_features, refusal
from llmbus.contract.messages import InferenceRequest, new_request_id
from llmbus.contract.tool_calls import assemble_tool_calls
from llmbus.security.apikeys import ApiKeyStore
from llmbus_services.gateway.adapters import metrics
from llmbus_services.gateway.adapters.catalog import CatalogFollower, ModelCatalog
from llmbus_services.gateway.adapters.relay import Exchange, Relay
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.core import errors
from llmbus_services.gateway.core.feedback import FeedbackBody
from llmbus_services.gateway.core.hints import BadHint, routing_hints
from llmbus_services.gateway.core.openai_types import ChatCompletionBody, CompletionBody, Unsupported
from llmbus_services.gateway.core.translate import ResponseShape, finish_reason, to_request

log = logging.getLogger(__name__)
tracer = trace.get_tracer("llmbus.gateway")
REQUEST_ID_HEADER = "x-request-id"
Kind = Literal["chat", "completion"]


class Gateway:
    """What the handlers need, wired once in app.py."""

    def __init__(
        self,
        settings: GatewaySettings,
        relay: Relay,
        keys: ApiKeyStore | None,
        catalog: ModelCatalog,
        follower: CatalogFollower,
    ) -> None:
        self.settings = settings
        self.relay = relay
        self.keys = keys
        self.catalog = catalog
        self.follower = follower

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


def _validation_error(exc: ValidationError) -> errors.ApiError:
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return errors.invalid(f"Invalid value for `{param}`: {first['msg']}", param=param)


def _parse(data: dict[str, object], model: type[BaseModel]) -> ChatCompletionBody | CompletionBody:
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from exc
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


def _sse(data: object) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _sse_events(
    gw: Gateway, exchange: Exchange, shape: ResponseShape, include_usage: bool, started: float
) -> AsyncIterator[bytes]:
    """The SSE body, from the first accepted chunk (already in the assembler) to [DONE]."""
    sent_first = False
    try:
        while True:
            try:
                delta, calls = exchange.unseen(), exchange.unseen_tool_calls()
            except RetryDiverged as exc:
                yield _sse(errors.unavailable(f"retry could not continue the stream: {exc}").body())
                break
            if delta or calls:
                if not sent_first:
                    metrics.TTFT_SECONDS.labels(shape.kind).observe(time.perf_counter() - started)
                yield _sse(
                    shape.stream_chunk(
                        delta, first=not sent_first, finish=None, include_usage=include_usage, tool_calls=calls
                    )
                )
                sent_first = True
            final = exchange.assembler.final
            if final is not None:
                if final.error is not None:
                    yield _sse(errors.from_error_info(final.error).body())
                else:
                    reason = finish_reason(final.finish_reason)
                    yield _sse(shape.stream_chunk("", first=not sent_first, finish=reason, include_usage=include_usage))
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


async def _unless_gone(gw: Gateway, request: Request, waiting: Coroutine[Any, Any, object]) -> None:
    """Wait for `waiting`; a client that hangs up meanwhile cancels the request (and frees its slot) now."""
    task = asyncio.ensure_future(waiting)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=gw.settings.disconnect_poll_s)
            if not task.done() and await request.is_disconnected():
                metrics.CANCELLED.inc()
                task.cancel()
                raise errors.ApiError(499, "client closed the request", "cancelled", "cancelled")
        task.result()
    finally:
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
        raise _validation_error(exc) from exc
    if not gw.relay.healthy():  # its answer could never be read: refuse now, as /ready does
        raise errors.unavailable("This gateway instance lost its reply stream.", retry_after_s=1)
    _check_engines_can(gw.catalog, inference)
    if gw.relay.in_flight >= gw.settings.max_in_flight:
        raise errors.unavailable("This gateway instance is at its limit of requests in flight.", retry_after_s=1)
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
            await _unless_gone(gw, request, exchange.next_chunk(gw.settings.first_chunk_timeout_s))
        except TimeoutError:
            raise errors.ApiError(504, "No answer started within the time limit.", "timeout", "timeout") from None
        final = exchange.assembler.final
        if final is not None and final.error is not None:
            raise errors.from_error_info(final.error)  # failed before any text: a proper HTTP status
        shape = ResponseShape(kind, request_id, int(time.time()), exchange.model or body.model)
        if body.stream:
            handed_over = True
            return StreamingResponse(
                _sse_events(gw, exchange, shape, body.include_usage, started),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
            )
        await _unless_gone(gw, request, _collect(gw, exchange))
        final = exchange.assembler.final
        assert final is not None
        if final.error is not None:
            raise errors.from_error_info(final.error)
        shape.model = exchange.model or shape.model
        metrics.TTFT_SECONDS.labels(kind).observe(time.perf_counter() - started)
        calls = assemble_tool_calls(exchange.assembler.tool_calls)
        return JSONResponse(shape.full(exchange.assembler.text, finish_reason(final.finish_reason), final.usage, calls))
    finally:
        if not handed_over:
            exchange.close()
            metrics.IN_FLIGHT.dec()


async def give_feedback(gw: Gateway, request: Request) -> JSONResponse:
    """Onto the shared llm.feedback (the gateway's alone when auth is on) as the API key's tenant."""
    tenant = await gw.tenant_of(request)
    try:
        body = FeedbackBody.model_validate(
            await read_json(request, gw.settings.max_body_bytes, gw.settings.body_timeout_s)
        )
    except ValidationError as exc:
        raise _validation_error(exc) from exc
    bus = gw.relay.bus
    try:
        await bus.publisher.publish(
            bus.topics.name(t.FEEDBACK), body.as_tenants(tenant), key=body.request_id, request_id=body.request_id
        )
    except Exception as exc:
        log.exception("could not publish feedback on %s", body.request_id)
        raise errors.unavailable("The feedback could not be handed to the bus.") from exc
    return JSONResponse({"object": "feedback", "request_id": body.request_id, "tenant": tenant}, status_code=202)


class RequestIdMiddleware:
    """Gives every HTTP request an id (the llmbus request id) and returns it in `x-request-id`.

    Plain ASGI rather than BaseHTTPMiddleware, which would sit between a stream and its client.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((REQUEST_ID_HEADER.encode(), request_id.encode()))
            await send(message)

        await self.app(scope, receive, send_with_id)


def _endpoint(request: Request) -> str:
    """The route's template (`/v1/models/{model:path}`), never the raw path: any client could mint series."""
    route = request.scope.get("route")
    return str(getattr(route, "path", "unmatched"))


def create_app(gw: Gateway) -> FastAPI:
    app = FastAPI(title="llmbus gateway", version="1", docs_url=None, redoc_url=None)
    app.add_middleware(RequestIdMiddleware)

    @app.exception_handler(errors.ApiError)
    async def api_error(request: Request, exc: errors.ApiError) -> JSONResponse:
        metrics.HTTP_REQUESTS.labels(_endpoint(request), str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = "unknown_url" if exc.status_code == 404 else None
        message = f"{exc.detail}: {request.method} {request.url.path}"
        return JSONResponse(
            errors.ApiError(exc.status_code, message, "invalid_request_error", code).body(), exc.status_code
        )

    @app.get("/metrics")
    async def metrics_text() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        checks = {"reply_tail": gw.relay.healthy(), "catalog": gw.follower.caught_up.is_set()}
        return JSONResponse({"ready": all(checks.values()), **checks}, status_code=200 if all(checks.values()) else 503)

    @app.get("/v1/models")
    async def list_models(request: Request) -> dict[str, object]:
        await gw.tenant_of(request)
        return {"object": "list", "data": gw.catalog.listing()}

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> dict[str, object]:
        await gw.tenant_of(request)
        for entry in gw.catalog.listing():
            if entry["id"] == model:
                return entry
        raise errors.model_not_found(model)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        response = await complete(gw, request, "chat")
        metrics.HTTP_REQUESTS.labels(_endpoint(request), str(response.status_code)).inc()
        return response

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        response = await complete(gw, request, "completion")
        metrics.HTTP_REQUESTS.labels(_endpoint(request), str(response.status_code)).inc()
        return response

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> Response:
        response = await give_feedback(gw, request)
        metrics.HTTP_REQUESTS.labels(_endpoint(request), str(response.status_code)).inc()
        return response

    return app
