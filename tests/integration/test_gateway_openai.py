"""The gateway on the real stack (router, scheduler, a sim worker, Kafka, Redis), driven by the
official `openai` SDK, plain httpx and curl: answers, streams, errors, and cancel on disconnect."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.bus.tables import read_log
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Control, ControlAction, Dispatch, ErrorCode, Feedback, ModelSpec, ResultStatus
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO, ServiceProc, drop_namespace, fresh_settings, wait_workers_ready
from tests.support import eventually, gateway_sentinel, results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

MODEL = "sim-llama-8b"
ORPHAN = "sim-orphan"  # declared on llm.models, served by nobody


def policy_file(path: Path) -> Path:
    """The default policy plus a tenant with a one-request burst and a route nobody serves."""
    policy = yaml.safe_load((REPO / "services/router/policies/default.yaml").read_text())
    policy["tenants"]["tiny"] = {"requests_per_s": 0.01, "burst_requests": 1}
    policy["models"][ORPHAN] = {"tier": "sim"}
    policy["rules"].insert(0, {"name": "orphans", "when": {"models": [ORPHAN]}, "target": ORPHAN, "fallback": [ORPHAN]})
    path.write_text(yaml.safe_dump(policy))
    return path


@dataclass
class Stack:
    settings: BusSettings
    base_url: str
    key: str
    tiny_key: str
    key_env: dict[str, str]
    span_dir: Path
    metrics_urls: dict[str, str]
    procs: dict[str, ServiceProc]


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None) -> AsyncIterator[Stack]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    bus = await Bus.start(settings, t.CLIENT)
    topics = t.Topics(settings.topic_prefix)
    await bus.publisher.publish(topics.name(t.MODELS), ModelSpec(name=ORPHAN), key=ORPHAN)
    await bus.stop()
    redis = redis_client(settings.redis_url)
    keys = ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix))
    key, _ = await keys.create("acme")
    tiny_key, _ = await keys.create("tiny")
    port = free_port()
    log_dir = tmp_path_factory.mktemp("logs")
    policy = policy_file(log_dir / "policy.yaml")
    ports = {name: free_port() for name in ("router", "scheduler", "w1", "w2")}

    def env(name: str, **more: str) -> dict[str, str]:
        """Every process writes its spans to its own file and serves /metrics on its own port."""
        return (
            {"LLMBUS_TRACE_FILE": str(log_dir / f"spans-{name}.jsonl")}
            | ({"LLMBUS_METRICS_PORT": str(ports[name]), "LLMBUS_METRICS_HOST": "127.0.0.1"} if name in ports else {})
            | more
        )

    procs = [
        ServiceProc(
            "llmbus_services.router",
            settings,
            env("router", LLMBUS_ROUTER_POLICY_PATH=str(policy), LLMBUS_ROUTER_DEFAULT_MODEL=MODEL),
            log_dir,
        ).start(),
        ServiceProc(
            "llmbus_services.scheduler", settings, env("scheduler", LLMBUS_SCHEDULER_NO_WORKER_TIMEOUT_S="3"), log_dir
        ).start(),
        # Two workers of the same model, both quick to hand work back when stopped: the retry test
        # stops whichever one the scheduler picked (a tie, broken at random), and with the default
        # grace (20 s) that one would finish the answer itself instead of handing it back.
        *(
            ServiceProc(
                "llmbus_services.engine_worker",
                settings,
                env(w, LLMBUS_WORKER_WORKER_ID=w, LLMBUS_WORKER_DRAIN_GRACE_S="0.5"),
                log_dir,
                w,
            ).start()
            for w in ("w1", "w2")
        ),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            env("gateway", LLMBUS_GATEWAY_PORT=str(port), LLMBUS_GATEWAY_INSTANCE_ID="gw-test"),
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    metrics_urls = {name: f"http://127.0.0.1:{p}/metrics" for name, p in ports.items()}
    metrics_urls["gateway"] = f"{base_url}/metrics"
    try:
        await wait_workers_ready(settings, {"w1", "w2"}, timeout_s=240)

        async def gateway_ready() -> bool:
            try:
                async with httpx.AsyncClient() as http:
                    return (await http.get(f"{base_url}/ready", timeout=2)).status_code == 200
            except httpx.HTTPError:
                return False

        await eventually(gateway_ready, timeout_s=90, interval_s=0.3)
        yield Stack(
            settings,
            base_url,
            key,
            tiny_key,
            {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix},
            log_dir,
            metrics_urls,
            {proc.name: proc for proc in procs},
        )
    except BaseException:
        for proc in procs:
            print(f"\n--- log of {proc.name} ---\n{proc.log_tail()}")
        raise
    finally:
        for proc in procs:
            proc.kill()
        await redis.aclose()
        await drop_namespace(settings)


def sdk(stack: Stack, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key or stack.key, max_retries=0, timeout=120)


async def sentinel(stack: Stack) -> str:
    return await gateway_sentinel(stack.base_url, stack.key, MODEL)


async def test_chat_completion_not_streaming(stack: Stack) -> None:
    results = await TopicTail(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.RESULTS)).start()
    try:
        raw = await sdk(stack).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is a control plane?"}],
            max_tokens=16,
            temperature=0,
            extra_body={"tenant": "someone-else"},
        )
        completion = raw.parse()
        request_id = raw.headers["x-request-id"]
        found = await results_then_sentinel(stack.settings, {request_id}, results, lambda: sentinel(stack))
    finally:
        await results.stop()
    [result] = found[request_id]
    assert completion.id == f"chatcmpl-{request_id}" and completion.model == MODEL
    assert completion.choices[0].message.content == result.text and result.text
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert completion.usage is not None and completion.usage.completion_tokens == result.usage.completion_tokens
    assert result.tenant == "acme"  # from the key, not from the body


async def test_chat_completion_streaming_with_usage(stack: Stack) -> None:
    stream = await sdk(stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me about Kafka partitions."}],
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 4 and text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert 0 < usage_chunk.usage.completion_tokens <= 40 and usage_chunk.usage.prompt_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


async def test_completions_streaming_and_not(stack: Stack) -> None:
    client = sdk(stack)
    done = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
    assert done.object == "text_completion" and done.choices[0].text and done.usage is not None
    assert done.usage.completion_tokens <= 8
    stream = await client.completions.create(model="auto", prompt="Once upon a time", max_tokens=8, stream=True)
    parts = [c async for c in stream]
    assert "".join(c.choices[0].text for c in parts) and parts[-1].choices[0].finish_reason in ("stop", "length")
    assert parts[0].model == MODEL  # `auto`: the router's policy picked it


async def test_models_from_catalog_and_fleet(stack: Stack) -> None:
    models = {m.id: m for m in (await sdk(stack).models.list()).data}
    assert {MODEL, ORPHAN} <= set(models)
    assert (await sdk(stack).models.retrieve(MODEL)).id == MODEL
    with pytest.raises(openai.NotFoundError):
        await sdk(stack).models.retrieve("no-such-model")


async def test_errors_have_openai_shapes_and_statuses(stack: Stack) -> None:
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(openai.AuthenticationError) as caught:
        await sdk(stack, key="sk-llmbus-wrong").chat.completions.create(model=MODEL, **ask)  # type: ignore[call-overload]
    assert caught.value.code == "invalid_api_key" and caught.value.response.headers["x-request-id"]
    with pytest.raises(openai.NotFoundError) as not_found:
        await sdk(stack).chat.completions.create(model="no-such-model", **ask)  # type: ignore[call-overload]
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk(stack).chat.completions.create(model=MODEL, n=2, **ask)  # type: ignore[call-overload]
    assert bad.value.param == "n"
    with pytest.raises(openai.BadRequestError):
        await sdk(stack).chat.completions.create(model=MODEL, temperature=7, **ask)  # type: ignore[call-overload]
    async with httpx.AsyncClient(base_url=stack.base_url) as http:
        auth = {"authorization": f"Bearer {stack.key}"}
        big = await http.post("/v1/chat/completions", headers=auth, content=b"x" * (5 * 1024 * 1024))
        assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
        assert (await http.post("/v1/chat/completions", headers=auth, content=b"{nope")).status_code == 400
        unknown = await http.get("/v1/nothing-here", headers=auth)
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    # The router's token bucket (tenant `tiny`: one request, then a long wait) -> 429 with Retry-After.
    tiny = sdk(stack, key=stack.tiny_key)
    await tiny.chat.completions.create(model=MODEL, **ask)  # type: ignore[call-overload]
    with pytest.raises(openai.RateLimitError) as limited:
        await tiny.chat.completions.create(model=MODEL, **ask)  # type: ignore[call-overload]
    assert int(limited.value.response.headers["retry-after"]) >= 1


async def test_a_model_no_worker_serves_now_is_a_503_with_retry_after(stack: Stack) -> None:
    """Declared on llm.models, served by no live worker: the scheduler holds the request for a worker
    (no_worker_timeout_s, 3 s here), none comes, it ends model_unavailable -> 503 + Retry-After."""
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(openai.InternalServerError) as unavailable:
        await sdk(stack).chat.completions.create(model=ORPHAN, **ask)  # type: ignore[call-overload]
    response = unavailable.value.response
    assert response.status_code == 503 and unavailable.value.code == "model_unavailable"
    assert int(response.headers["retry-after"]) >= 1 and response.headers["x-request-id"]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error"
    assert ORPHAN in error["message"]
    # The same through a stream: it fails before any text, so it is a plain 503 too, not an SSE error.
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as http:
        streamed = await http.post(
            "/v1/chat/completions",
            json={"model": ORPHAN, "stream": True, **ask},
            headers={"authorization": f"Bearer {stack.key}"},
        )
    assert streamed.status_code == 503 and int(streamed.headers["retry-after"]) >= 1
    assert streamed.json()["error"]["code"] == "model_unavailable"


async def test_a_client_that_hangs_up_cancels_its_request(stack: Stack) -> None:
    topics = t.Topics(stack.settings.topic_prefix)
    control = await TopicTail(stack.settings, topics.name(t.CONTROL)).start()
    results = await TopicTail(stack.settings, topics.name(t.RESULTS)).start()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "A long story, please."}], "max_tokens": 3000}
    try:
        async with (
            httpx.AsyncClient(base_url=stack.base_url, timeout=30) as http,
            http.stream(
                "POST",
                "/v1/chat/completions",
                json=body | {"stream": True},
                headers={"authorization": f"Bearer {stack.key}"},
            ) as response,
        ):
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # one token seen; now hang up
        cancels = []
        async for record in control.records(15):
            message = decode(record, Control)
            if message.target_id.split(":", 1)[-1] == request_id:  # `<tenant>:<request id>`
                cancels.append(message)
                break
        assert cancels and cancels[0].action == ControlAction.CANCEL
        found = await results_then_sentinel(stack.settings, {request_id}, results, lambda: sentinel(stack))
        [result] = found[request_id]
        assert result.status == ResultStatus.ERROR and result.error is not None
        assert result.error.code == ErrorCode.CANCELLED and result.usage.completion_tokens < 3000
    finally:
        await control.stop()
        await results.stop()


def readme_curl() -> str:
    """The curl command of the README's gateway section (between its `gateway-curl` markers)."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- gateway-curl -->")[1]
    lines = block.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("curl "))
    command = []
    for line in lines[first:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return " ".join(command)


async def test_curl_example_from_the_readme(stack: Stack) -> None:
    """The README's curl lines, with a key made by `llmbus keys create`."""
    env = os.environ | stack.key_env
    made = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmbus.cli.main", "keys", "create", "--tenant", "curl-test", "--name", "readme"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    key = made.stdout.strip().splitlines()[-1]
    assert key.startswith("sk-llmbus-")
    out = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", readme_curl().replace("http://127.0.0.1:8000", stack.base_url)],
        env=env | {"LLMBUS_KEY": key},
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    events = [line.removeprefix("data: ") for line in out.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 3
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    listed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmbus.cli.main", "keys", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    assert "curl-test" in listed.stdout


def spans_of_trace(span_dir: Path, request_id: str) -> list[dict[str, object]]:
    # Whole lines only: a service may be writing its last span while we read (a line without its "\n").
    spans = [
        json.loads(line)
        for path in span_dir.glob("spans-*.jsonl")
        for line in path.read_text().splitlines(keepends=True)
        if line.endswith("\n") and line.strip()
    ]
    trace_ids = {s["trace_id"] for s in spans if s["attributes"].get("llmbus.request_id") == request_id}
    assert len(trace_ids) == 1, f"request {request_id} in traces {trace_ids}"
    return [s for s in spans if s["trace_id"] in trace_ids]


async def test_one_connected_trace_across_every_service(stack: Stack) -> None:
    raw = await sdk(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Trace me."}], max_tokens=8
    )
    request_id = raw.headers["x-request-id"]
    wanted = {"llmbus-gateway", "llmbus-router", "llmbus-scheduler", "llmbus-engine-worker"}

    def missing_parents(spans: list[dict[str, object]]) -> set[object]:
        ids = {s["span_id"] for s in spans}
        return {s["parent_id"] for s in spans if s["parent_id"] is not None and s["parent_id"] not in ids}

    async def all_hops_written() -> bool:
        # A span is written when it ends, and a consumer's span ends after the publishes inside it
        # (the worker's dispatch span outlives its `llm.results publish`): wait for the parents too.
        spans = spans_of_trace(stack.span_dir, request_id)
        hops = wanted <= {s["service"] for s in spans} and any(s["name"].endswith("llm.results publish") for s in spans)
        return hops and not missing_parents(spans)

    try:
        await eventually(all_hops_written, timeout_s=30)
    except TimeoutError:
        spans = spans_of_trace(stack.span_dir, request_id)
        services = {s["service"] for s in spans}
        raise AssertionError(
            f"trace incomplete: services {services}, missing parents {missing_parents(spans)}"
        ) from None
    spans = spans_of_trace(stack.span_dir, request_id)
    roots = [s for s in spans if s["parent_id"] is None]
    assert len(roots) == 1 and roots[0]["service"] == "llmbus-gateway" and roots[0]["kind"] == "SERVER"
    kinds = {(s["service"], s["kind"]) for s in spans}
    for service in wanted - {"llmbus-gateway"}:
        assert (service, "CONSUMER") in kinds and (service, "PRODUCER") in kinds
    by_name = {s["name"]: s["attributes"] for s in spans}
    ns = stack.settings.topic_prefix
    assert roots[0]["attributes"]["gen_ai.request.model"] == MODEL
    assert roots[0]["attributes"]["gen_ai.usage.output_tokens"] >= 1
    routed = by_name[f"{ns}llm.routed publish"]
    assert routed["llmbus.route.rule"] == "rule:explicit" and routed["llmbus.shadow"] is False
    [dispatch] = [a for n, a in by_name.items() if n.startswith(f"{ns}llm.dispatch.") and n.endswith(" publish")]
    assert dispatch["llmbus.worker_id"] in ("w1", "w2") and dispatch["llmbus.attempt"] == 1
    assert dispatch["llmbus.queue_time_ms"] >= 0
    result = by_name[f"{ns}llm.results publish"]
    assert result["gen_ai.response.model"] == MODEL and result["gen_ai.usage.output_tokens"] >= 1
    assert result["gen_ai.response.finish_reasons"] == ["length"] or result["gen_ai.response.finish_reasons"] == [
        "stop"
    ]
    for key in ("llmbus.node_id", "llmbus.model.version", "llmbus.preemptions", "llmbus.cached_prefix_tokens"):
        assert key in result, key
    assert "llmbus.queue_time_ms" in result and "gen_ai.server.time_to_first_token" in result


async def test_feedback_is_the_api_keys_tenants(stack: Stack) -> None:
    url, auth = f"{stack.base_url}/v1/feedback", {"authorization": f"Bearer {stack.key}"}
    async with httpx.AsyncClient(timeout=10) as http:
        given = await http.post(url, json={"request_id": "r-fb", "score": 0.9}, headers=auth)
        claim = await http.post(url, json={"request_id": "r-fb", "score": 0.1, "tenant": "globex"}, headers=auth)
        anonymous = await http.post(url, json={"request_id": "r-fb", "score": 0.1})
    assert given.status_code == 202 and given.json()["tenant"] == "acme", given.text
    assert claim.status_code == 400 and "tenant" in claim.text
    assert anonymous.status_code == 401
    logged = await read_log(stack.settings, t.Topics(stack.settings.topic_prefix).name(t.FEEDBACK), Feedback, 10)
    assert [(f.request_id, f.tenant, f.score) for _, f in logged] == [("r-fb", "acme", 0.9)]


async def test_catalog_names_every_topic_the_services_really_use(stack: Stack) -> None:
    """What each process published and consumed (its own counters) must be in the topic catalog."""
    from prometheus_client.parser import text_string_to_metric_families

    topics = t.Topics(stack.settings.topic_prefix)
    used: set[tuple[str, str, str]] = set()
    async with httpx.AsyncClient(timeout=5) as http:
        for url in stack.metrics_urls.values():
            for family in text_string_to_metric_families((await http.get(url)).text):
                for sample in family.samples:
                    topic = sample.labels.get("topic", "")
                    if not topic.startswith(topics.prefix):
                        continue
                    if sample.name == "llmbus_messages_published_total":
                        used.add((sample.labels["service"], "writes", topic))
                    elif sample.name == "llmbus_messages_consumed_total":
                        used.add((sample.labels["service"], "reads", topic))
    assert {s for s, _, _ in used} >= {"router", "scheduler", "engine-worker", "gateway"}
    wrong = []
    for service, verb, topic in sorted(used):
        spec = topics.spec_of(topic)
        if service not in (spec.writers if verb == "writes" else spec.readers):
            wrong.append(f"{service} {verb} {spec.name}")
    assert not wrong, f"the declarations (llmbus/contract/contracts.py) do not say: {wrong}"


async def worker_of(dispatches: dict[str, TopicTail], request_id: str, timeout_s: float = 20) -> str:
    """The worker whose dispatch topic carried the request (it is there before the first token;
    reading it may take a while on a loaded machine)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for worker_id, tail in dispatches.items():
            async for record in tail.records(0.2):
                if decode(record, Dispatch).request_id == request_id:
                    return worker_id
    raise AssertionError(f"no dispatch of {request_id} seen within {timeout_s}s")


async def test_a_retried_request_streams_on_without_repeating_text(stack: Stack) -> None:
    """The worker running a stream is stopped mid-answer: it hands the request back, the scheduler
    places attempt 2 on the other worker, and the client sees each character once. Runs last: it
    stops a worker."""
    topics = t.Topics(stack.settings.topic_prefix)
    dispatches = {w: await TopicTail(stack.settings, topics.dispatch(w)).start() for w in ("w1", "w2")}
    results = await TopicTail(stack.settings, topics.name(t.RESULTS)).start()
    try:
        raw = await sdk(stack).chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": "A long answer, please, about retries."}],
            max_tokens=2000,  # about 12 s of sim time: the stop lands mid-answer even on a loaded machine
            stream=True,
        )
        request_id = raw.headers["x-request-id"]
        stream = raw.parse()
        text = ""
        first_worker = None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            if first_worker is None and text:
                first_worker = await worker_of(dispatches, request_id)
                await asyncio.to_thread(stack.procs[first_worker].terminate, 60)
        found = await results_then_sentinel(stack.settings, {request_id}, results, lambda: sentinel(stack))
    finally:
        for tail in (*dispatches.values(), results):
            await tail.stop()
    [result] = found[request_id]
    assert result.attempt == 2, f"attempt {result.attempt} by {result.worker_id} finished; {first_worker} was stopped"
    assert result.worker_id != first_worker and result.status == ResultStatus.OK
    assert text == result.text  # every character once, in order
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "llmbus.cli.main", "trace", request_id, "--since-minutes", "10"],
        env=os.environ | stack.key_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = out.stdout
    assert f"attempt 1: worker {first_worker}" in lines and "outcome: retryable handed_back" in lines
    assert f"attempt 2: worker {result.worker_id}" in lines and "result: ok by engine-worker (attempt 2)" in lines
    assert "preemptions 0" in lines and "model version 1" in lines
