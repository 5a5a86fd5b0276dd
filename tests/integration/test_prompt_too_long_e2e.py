"""Over-length CJK and code prompts end `prompt_too_long` at the router, counted with the model's real
tokenizer, on the real broker: router, scheduler and a sim worker each their own process.

The prompts are chosen so that 4 characters per token finds them short enough and the model's
tokenizer (Mistral NeMo's Tekken, from mistral-common's package data) finds them too long. Counted
the old way they were admitted; on a worker that counts with the real tokenizer they were refused
as a retryable OVER_CAPACITY, retried on every worker and ended `max_attempts`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmbus import topics as t
from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.client import LlmbusClient, TopicTail, collect_results
from llmbus.messages import ChatMessage, ErrorCode, InferenceRequest, ModelSpec, ResultStatus
from llmbus.settings import BusSettings
from llmbus.tokens import load_tokenizer
from tests.support import ServiceProc, wait_workers_ready

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

TEKKEN = "pkg:mistral_common/data/tekken_240911.json"
MODEL = "sim-llama-8b"
MAX_MODEL_LEN = 8192
MAX_TOKENS = 3000
CORPUS = Path(__file__).resolve().parents[2] / "data" / "tokens" / "corpus.jsonl"


def _text_of(script: str, chars: int) -> str:
    samples = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    one = "\n".join(s["text"] for s in samples if s["script"] == script and s["lang"] != "python")
    return (one * (chars // len(one) + 1))[:chars]


def _over_length_only_for_the_tokenizer(text: str) -> str:
    real = load_tokenizer(TEKKEN).count(text)
    assert math.ceil(len(text) / 4) + MAX_TOKENS < MAX_MODEL_LEN < real + MAX_TOKENS, (len(text), real)
    return text


async def test_over_length_cjk_and_code_prompts_end_prompt_too_long_at_the_router(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    await ensure_catalog(bus_settings)
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    try:
        spec = ModelSpec(name=MODEL, max_model_len=MAX_MODEL_LEN, tokenizer=TEKKEN)
        await bus.publisher.publish(topics.name(t.MODELS), spec, key=MODEL)
    finally:
        await bus.stop()
    worker_env = {"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_SIM_SPEEDUP": "50", "LLMBUS_WORKER_TOKENIZER": TEKKEN}
    services.append(ServiceProc("services.router", bus_settings).start())
    services.append(ServiceProc("services.scheduler", bus_settings).start())
    services.append(ServiceProc("services.engine_worker", bus_settings, name="w1", env=worker_env).start())
    await wait_workers_ready(bus_settings, {"w1"})
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()

    cjk = _over_length_only_for_the_tokenizer(_text_of("cjk", 8000))
    code = _over_length_only_for_the_tokenizer(_text_of("code", 16000))
    requests = {
        "cjk": InferenceRequest(model=MODEL, max_tokens=MAX_TOKENS, messages=[ChatMessage(role="user", content=cjk)]),
        "code": InferenceRequest(model=MODEL, max_tokens=MAX_TOKENS, prompt=code),
        "fits": InferenceRequest(model=MODEL, max_tokens=8, messages=[ChatMessage(role="user", content=cjk[:500])]),
    }
    async with LlmbusClient(bus_settings) as client:
        for request in requests.values():
            await client.send(request)
    ids = {r.request_id for r in requests.values()}
    found = await collect_results(bus_settings, ids, timeout_s=60, tail=results)
    await results.stop()

    for name in ("cjk", "code"):
        [result] = found[requests[name].request_id]
        assert result.status == ResultStatus.ERROR and result.error is not None, name
        assert result.error.code == ErrorCode.PROMPT_TOO_LONG and not result.error.retryable, (name, result.error)
        assert result.produced_by == "router", name
        assert TEKKEN in result.error.message, "the refusal says it counted with the model's tokenizer"
    [ok] = found[requests["fits"].request_id]
    assert ok.status == ResultStatus.OK and ok.usage.prompt_tokens == load_tokenizer(TEKKEN).count(
        requests["fits"].prompt_text()
    ), "the worker counts with the same tokenizer"
