"""The gateway's HTTP flow on its own wiring (app.build: reply topic and relay, catalog, API keys) in memory and on
the real broker, through the app it serves (create_app over what build returns) on httpx's ASGI transport: an
HTTP request goes out on llm.requests as its tenant's, and what the test writes on the gateway's reply topic (as
a worker would) comes back as the HTTP answer, whole or streamed; a reply chunk that does not decode ends its
request with a 500 and goes to llm.dlq."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, FinishReason, InferenceRequest, ModelSpec, TokenChunk, Usage
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.state.store import redis_client
from llmbus_services.gateway.app import build
from llmbus_services.gateway.config import GatewaySettings
from llmbus_services.gateway.flows import create_app
from llmbus_tools.harness.ports import free_port
from tests.fixtures.buses import EitherBus

pytestmark = pytest.mark.redis

MODEL = "sim-llama-8b"
INSTANCE = "gw-buses"


async def sent(on_bus: EitherBus, posting: asyncio.Task[httpx.Response], seen: set[str]) -> InferenceRequest:
    """The one request on llm.requests not `seen` before, once the gateway has published it (its HTTP call
    waits for the answer meanwhile); on the broker the topic's partitions come back in no order."""
    requests = await on_bus.published(
        on_bus.topics.name(t.REQUESTS), InferenceRequest, until=lambda found: len(found) > len(seen)
    )
    [new] = [r for r in requests if r.request_id not in seen]
    assert len(requests) == len(seen) + 1 and not posting.done()
    seen.add(new.request_id)
    return new


async def answer(on_bus: EitherBus, request: InferenceRequest, parts: list[str]) -> None:
    """The reply chunks a worker would write on the request's reply topic, the last one final with its usage."""
    for seq, part in enumerate(parts):
        final = seq == len(parts) - 1
        chunk = TokenChunk(
            request_id=request.request_id,
            tenant=request.tenant,
            seq=seq,
            delta=part,
            tokens=1,
            final=final,
            finish_reason=FinishReason.STOP if final else None,
            usage=Usage(prompt_tokens=5, completion_tokens=len(parts)) if final else None,
            model=MODEL,
        )
        await on_bus.send(on_bus.topics.name(request.reply_topic), chunk, key=request.request_id)


def sse_events(body: str) -> list[Any]:
    """The data of each server-sent event: a JSON object, or the closing `[DONE]`."""
    return [
        data if (data := line.removeprefix("data: ")) == "[DONE]" else json.loads(data)
        for line in body.splitlines()
        if line.startswith("data: ")
    ]


async def test_an_http_request_goes_out_on_the_bus_and_its_reply_comes_back_whole_or_streamed(
    on_bus: EitherBus,
) -> None:
    topics = on_bus.topics
    redis = redis_client(on_bus.settings.redis_url)
    secret, _ = await ApiKeyStore(redis, gateway_key_namespace(on_bus.settings.topic_prefix)).create("acme")
    await redis.aclose()
    gw = GatewaySettings(instance_id=INSTANCE, port=free_port(), require_api_key=True, worker_stale_s=3600)
    runtime = await on_bus.runtime(contracts.GATEWAY, client_suffix=f"-{INSTANCE}")
    gateway = await build(runtime, gw)
    await on_bus.send(topics.name(t.MODELS), ModelSpec(name=MODEL, tier="small"), key=MODEL)
    await on_bus.start(runtime)
    transport = httpx.ASGITransport(app=create_app(gateway))
    auth = {"authorization": f"Bearer {secret}"}
    seen: set[str] = set()
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "say hello"}], "max_tokens": 8}
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway", headers=auth, timeout=30) as http:
        ready = await http.get("/ready")
        assert ready.status_code == 200 and ready.json() == {"ready": True, "reply_tail": True, "catalog": True}
        refused = await http.post("/v1/chat/completions", json=chat, headers={"authorization": "Bearer no"})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        unknown = await http.post("/v1/chat/completions", json=chat | {"model": "nobody-serves-this"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"

        posting = asyncio.create_task(http.post("/v1/chat/completions", json=chat))
        request = await sent(on_bus, posting, seen)  # the 401 and the 404 never reached the bus
        assert (request.tenant, request.model, request.max_tokens) == ("acme", MODEL, 8)
        assert [(m.role, m.content) for m in request.messages] == [("user", "say hello")]
        assert request.reply_topic == t.replies_base(INSTANCE) and not request.stream
        await answer(on_bus, request, ["Hel", "lo ", "there"])
        whole = await asyncio.wait_for(posting, 30)
        assert whole.status_code == 200, whole.text
        assert whole.headers["x-request-id"] == request.request_id
        body = whole.json()
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        message = body["choices"][0]["message"]
        assert (message["role"], message["content"]) == ("assistant", "Hello there")
        assert body["choices"][0]["finish_reason"] == "stop"
        usage = body["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (5, 3, 8)

        streamed = chat | {"stream": True, "stream_options": {"include_usage": True}}
        posting = asyncio.create_task(http.post("/v1/chat/completions", json=streamed))
        request = await sent(on_bus, posting, seen)
        assert request.stream and request.tenant == "acme"
        await answer(on_bus, request, ["Str", "eam", "ed"])
        stream = await asyncio.wait_for(posting, 30)
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        *events, done = sse_events(stream.text)
        assert done == "[DONE]" and {e["id"] for e in events} == {events[0]["id"]}
        choices = [c for e in events for c in e["choices"]]
        assert choices[0]["delta"]["role"] == "assistant"
        assert "".join(c["delta"].get("content") or "" for c in choices) == "Streamed"
        assert [c["finish_reason"] for c in choices] == [None, None, None, "stop"]
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3

        posting = asyncio.create_task(http.post("/v1/chat/completions", json=chat))
        request = await sent(on_bus, posting, seen)
        poison = b'{"request_id": "%s", "tenant": "acme", "seq": "one"}' % request.request_id.encode()
        await on_bus.send(topics.name(request.reply_topic), poison, key=request.request_id)
        failed = await asyncio.wait_for(posting, 30)  # now, not after the first-chunk timeout
        assert failed.status_code == 500 and "could not be read" in failed.json()["error"]["message"]
    [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
    assert letter.source_topic == topics.replies(INSTANCE) and letter.request_id == request.request_id
    assert not runtime.contract.undeclared(topics, runtime.publisher.topics_written)
