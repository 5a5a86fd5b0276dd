"""The HTTP surface (FastAPI): the OpenAI-compatible routes over the flows, /v1/models from the catalog,
health, readiness (the reply tail alive, the catalog caught up) and /metrics."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmbus.contract.messages import new_request_id
from llmbus_services.gateway.adapters import metrics
from llmbus_services.gateway.core import errors
from llmbus_services.gateway.flows.completions import Gateway, complete
from llmbus_services.gateway.flows.feedback import give_feedback

REQUEST_ID_HEADER = "x-request-id"


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
        checks = {"reply_tail": gw.relay.healthy(), "catalog": gw.catalog_caught_up.is_set()}
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
