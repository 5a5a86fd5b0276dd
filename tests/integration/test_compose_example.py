"""The README's compose example as written, on the real broker and Redis: the gateway answers
`{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}` (no max_tokens) with a 200, the tier
worker configured as deploy/compose/docker-compose.yml configures it (its LLMBUS_WORKER_* settings; only
its speed is the test's). An unset max_tokens is what vllm serve and the OpenAI API make of it: the
model's output cap, bounded by the window the serving worker has left — a worker whose window is
smaller than the catalog's answers with what fits, never a refusal — and the answer ends where the
model ends it (the sim's natural length, finish "stop").
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from llmbus.bus.admin import ensure_catalog
from llmbus.security.apikeys import ApiKeyStore, gateway_key_namespace
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_services.router.core.config import load_policy
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO, ServiceProc, fresh_settings, wait_workers_ready
from tests.support import module_stack, wait_http_ok

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

README_BODY = '{"model": "auto", "messages": [{"role": "user", "content": "hi"}]}'
NARROW_WINDOW = 8192  # a worker's window when nothing sets one (the sim's default)


def compose_worker_env(service: str) -> dict[str, str]:
    """A worker's own settings (LLMBUS_WORKER_*) as the compose file sets them, ${VAR:-default} rendered."""
    spec = yaml.safe_load((REPO / "deploy" / "compose" / "docker-compose.yml").read_text())
    env = spec["services"][service]["environment"]
    render = lambda value: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))  # noqa: E731
    return {name: render(value) for name, value in env.items() if name.startswith("LLMBUS_WORKER_")}


@dataclass
class Stack:
    settings: BusSettings
    base_url: str
    key: str

    async def post(self, body: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=self.base_url, timeout=300) as http:
            return await http.post("/v1/chat/completions", content=body, headers=headers)


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory, kafka_up: None, redis_up: None) -> AsyncIterator[Stack]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    redis = redis_client(settings.redis_url)
    key, _ = await ApiKeyStore(redis, gateway_key_namespace(settings.topic_prefix)).create("acme")
    log_dir = tmp_path_factory.mktemp("logs")
    port = free_port()
    fast = {"LLMBUS_WORKER_SIM_SPEEDUP": "0", "LLMBUS_METRICS_PORT": "0"}
    # The narrow worker's answers never end on their own: what bounds them is the window.
    endless = {"LLMBUS_WORKER_SIM_NATURAL_ANSWER_MEDIAN_TOKENS": str(10**9)}
    default_tier = compose_worker_env("worker-default")  # what `auto` routes "hi" to
    # The strong tier's worker without a window of its own, as compose ran it before it set one.
    narrow = {k: v for k, v in compose_worker_env("worker-strong").items() if k != "LLMBUS_WORKER_SIM_MAX_MODEL_LEN"}
    procs = [
        ServiceProc("llmbus_services.router", settings, {}, log_dir).start(),
        ServiceProc("llmbus_services.scheduler", settings, {}, log_dir).start(),
        ServiceProc("llmbus_services.engine_worker", settings, default_tier | fast, log_dir, "w-default").start(),
        ServiceProc("llmbus_services.engine_worker", settings, narrow | fast | endless, log_dir, "w-narrow").start(),
        ServiceProc(
            "llmbus_services.gateway",
            settings,
            {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": "gw-compose-example"},
            log_dir,
        ).start(),
    ]
    base_url = f"http://127.0.0.1:{port}"
    try:
        async with module_stack(procs, settings):
            ids = {default_tier["LLMBUS_WORKER_WORKER_ID"], narrow["LLMBUS_WORKER_WORKER_ID"]}
            await wait_workers_ready(settings, ids, timeout_s=240)
            await wait_http_ok(f"{base_url}/ready")
            yield Stack(settings, base_url, key)
    finally:
        await redis.aclose()


async def test_the_readmes_compose_example_answers_200_without_max_tokens(stack: Stack) -> None:
    readme = (REPO / "README.md").read_text()
    assert README_BODY in readme, "the body sent here is the README's"
    response = await stack.post(README_BODY)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    policy = load_policy()
    assert answer["model"] == policy.default.target == "gpt-4.1-mini"
    # The answer ends on its own (the sim's natural length), well inside the output cap and the window
    assert 0 < answer["usage"]["completion_tokens"] < policy.models["gpt-4.1-mini"].max_output_tokens
    assert answer["choices"][0]["finish_reason"] == "stop"


async def test_an_unset_max_tokens_is_bounded_by_the_serving_workers_window(stack: Stack) -> None:
    """gpt-4.1's output cap (32,768) is over this worker's 8,192-token window: the answer takes what the
    window leaves after the prompt (the router's 400 `context_length_exceeded` once)."""
    response = await stack.post('{"model": "gpt-4.1", "messages": [{"role": "user", "content": "hi"}]}')
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == NARROW_WINDOW
    assert response.json()["choices"][0]["finish_reason"] == "length"
