"""The feedback flow: a user's score of an answer -> Feedback on llm.feedback, as the key's tenant's."""

from __future__ import annotations

import logging

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from llmbus.contract import topics as t
from llmbus_services.gateway.core import errors
from llmbus_services.gateway.core.feedback import FeedbackBody
from llmbus_services.gateway.flows.completions import Gateway, read_json, validation_error

log = logging.getLogger(__name__)


async def give_feedback(gw: Gateway, request: Request) -> JSONResponse:
    """Onto the shared llm.feedback (the gateway's alone when auth is on) as the API key's tenant."""
    tenant = await gw.tenant_of(request)
    try:
        body = FeedbackBody.model_validate(
            await read_json(request, gw.settings.max_body_bytes, gw.settings.body_timeout_s)
        )
    except ValidationError as exc:
        raise validation_error(exc) from exc
    bus = gw.relay.bus
    try:
        await bus.publisher.publish(
            bus.topics.name(t.FEEDBACK), body.as_tenants(tenant), key=body.request_id, request_id=body.request_id
        )
    except Exception as exc:
        log.exception("could not publish feedback on %s", body.request_id)
        raise errors.unavailable("The feedback could not be handed to the bus.") from exc
    return JSONResponse({"object": "feedback", "request_id": body.request_id, "tenant": tenant}, status_code=202)
