"""What the openai-http engine sends upstream, and its per-upstream settings (validated)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from llmbus.contract.messages import ChatMessage
from llmbus_services.engine_worker.adapters.engines.factory import build_engine
from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpEngine
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig, load_upstreams
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import EngineRequest
from tests.unit.test_openai_http_breaker import Clock, Upstream, engine_on

CHAT = (
    ChatMessage(role="system", content="You answer in French."),
    ChatMessage(role="user", content="Hello"),
    ChatMessage(role="assistant", content="Bonjour !"),
    ChatMessage(role="user", content="How are you?"),
)
RENDERED = "".join(f"<|{m.role}|>\n{m.content}\n" for m in CHAT) + "<|assistant|>\n"


async def send(engine: OpenAIHttpEngine, request: EngineRequest) -> None:
    [o async for o in engine.generate(request)]


@pytest.mark.parametrize(
    ("api", "messages", "path", "sent"),
    [
        ("chat", CHAT, "/v1/chat/completions", {"messages": [m.model_dump(exclude_none=True) for m in CHAT]}),
        ("chat", (), "/v1/chat/completions", {"messages": [{"role": "user", "content": RENDERED}]}),
        ("completions", CHAT, "/v1/completions", {"prompt": RENDERED}),
        ("auto", CHAT, "/v1/chat/completions", {"messages": [m.model_dump(exclude_none=True) for m in CHAT]}),
        ("auto", (), "/v1/completions", {"prompt": RENDERED}),
    ],
)
async def test_chat_goes_to_chat_apis_as_sent_and_only_completion_apis_get_a_rendered_prompt(
    api: str, messages: tuple[ChatMessage, ...], path: str, sent: dict
) -> None:
    upstream = Upstream()
    engine = await engine_on(upstream, Clock(), api=api)
    await send(engine, EngineRequest("r", RENDERED, max_tokens=4, messages=messages))
    body = upstream.bodies[-1]
    assert upstream.paths[-1] == path
    assert {k: body[k] for k in sent} == sent
    assert not ({"messages", "prompt"} - set(sent)) & set(body)  # never both
    await engine.stop()


async def test_azure_style_key_header_query_parameters_and_extra_headers() -> None:
    seen: list[httpx.Request] = []
    upstream = Upstream()

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return upstream.handler(request)

    engine = OpenAIHttpEngine(
        load_upstreams_from(
            """
upstreams:
  - model: gpt-4.1
    base_url: https://res.openai.azure.com/openai/deployments/gpt41
    api_key: azure-secret
    api_key_header: api-key
    extra_query: {api-version: "2024-10-21"}
    extra_headers: {x-ms-client: llmbus}
"""
        )["gpt-4.1"],
        httpx.MockTransport(record),
    )
    await engine.start()
    await send(engine, EngineRequest("r", "hi", max_tokens=4, messages=CHAT[1:2]))
    req = seen[-1]
    assert req.url.path == "/openai/deployments/gpt41/chat/completions"
    assert req.url.params["api-version"] == "2024-10-21"
    assert req.headers["api-key"] == "azure-secret" and "authorization" not in req.headers
    assert req.headers["x-ms-client"] == "llmbus"
    await engine.stop()


def load_upstreams_from(text: str) -> dict[str, OpenAIHttpConfig]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "upstreams.yaml"
        path.write_text(text)
        return load_upstreams(path)


def test_each_worker_takes_its_models_upstream_with_its_own_limits(tmp_path: Path) -> None:
    path = tmp_path / "upstreams.yaml"
    path.write_text(
        """
upstreams:
  - model: gpt-4.1
    base_url: https://api.openai.com/v1
    max_model_len: 128000
    max_num_seqs: 256
    connect_timeout_s: 2
    first_token_timeout_s: 20
    stall_timeout_s: 30
    request_timeout_s: 300
    breaker: {failure_threshold: 3, cooldown_s: 15}
  - model: gpt-4.1-mini
    base_url: https://api.openai.com/v1
    max_model_len: 128000
"""
    )
    engine = build_engine(WorkerSettings(engine="openai-http", model="gpt-4.1", openai_upstreams_file=str(path)))
    assert isinstance(engine, OpenAIHttpEngine)
    assert (engine.max_model_len, engine.max_num_seqs) == (128_000, 256)  # what the heartbeat reports
    c = engine.config
    assert (c.connect_timeout_s, c.first_token_timeout_s, c.stall_timeout_s, c.request_timeout_s) == (2, 20, 30, 300)
    assert (c.breaker.failure_threshold, c.breaker.cooldown_s) == (3, 15)
    with pytest.raises(ValueError, match="no upstream for model 'gpt-5'"):
        build_engine(WorkerSettings(engine="openai-http", model="gpt-5", openai_upstreams_file=str(path)))


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ("max_model_len: 8", "max_model_len"),
        ("max_num_seqs: 0", "max_num_seqs"),
        ("stall_timeout_s: 0", "stall_timeout_s"),
        ("max_retry_after_s: -1", "max_retry_after_s"),
        ("continuation: assistant", "continuation"),
        ("deployments: [{base_url: http://y/v1, rpm: 0}]", "rpm"),
        ("deployments: [{base_url: http://y/v1, keys: 2}]", "extra"),
        ("api: responses", "api"),
        ("max_model_length: 128000", "extra"),  # a misspelt key is refused, not ignored
        ("breaker: {threshold: 3}", "extra"),
    ],
)
def test_bad_upstream_settings_are_refused_at_start(entry: str, error: str) -> None:
    with pytest.raises(ValidationError, match=error):
        load_upstreams_from(f"upstreams:\n  - model: m\n    base_url: http://x/v1\n    {entry}\n")


def test_a_model_listed_twice_is_refused() -> None:
    entry = "  - model: m\n    base_url: http://x/v1\n"
    with pytest.raises(ValueError, match="listed twice"):
        load_upstreams_from("upstreams:\n" + entry + entry)
