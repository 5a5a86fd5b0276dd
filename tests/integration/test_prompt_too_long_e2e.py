"""Over-length CJK and code prompts end `prompt_too_long` at the first place that knows, never retried,
on the real broker: router, scheduler and two sim workers each their own process, the workers counting
with a real tokenizer (Mistral NeMo's Tekken, from mistral-common's package data).

- `sim-llama-8b` has a ModelSpec naming that tokenizer: the router counts with it and refuses.
- `sim-unspecced-8b` has none: the router's per-script estimate finds the prompt just short enough,
  the worker's tokenizer does not; the scheduler learns the worker's count and ends it.

Counted the old way (4 characters per token) every one of them was admitted; on workers that count
with the real tokenizer each was refused as a retryable OVER_CAPACITY, retried and ended `max_attempts`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.client import LlmbusClient, TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import ChatMessage, ErrorCode, InferenceRequest, InferenceResult, ModelSpec, ResultStatus
from llmbus.settings import BusSettings
from llmbus.tokens import estimate_tokens, load_tokenizer
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready
from tests.support import results_then_sentinel

pytestmark = [pytest.mark.kafka, pytest.mark.redis]

TEKKEN = "pkg:mistral_common/data/tekken_240911.json"
SPECCED = "sim-llama-8b"
UNSPECCED = "sim-unspecced-8b"
MAX_MODEL_LEN = 8192  # both: the policy's (and the unknown-model default) and the sim workers'
MAX_TOKENS = 3000
CORPUS = Path(__file__).resolve().parents[2] / "data" / "tokens" / "corpus.jsonl"


def _text_of(script: str, chars: int, skip_lang: str = "python") -> str:
    samples = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    one = "\n".join(s["text"] for s in samples if s["script"] == script and s["lang"] != skip_lang)
    return (one * (chars // len(one) + 1))[:chars]


def _chat(model: str, text: str, max_tokens: int) -> InferenceRequest:
    return InferenceRequest(model=model, max_tokens=max_tokens, messages=[ChatMessage(role="user", content=text)])


def _refused(found: dict[str, list[InferenceResult]], request: InferenceRequest, by: str) -> InferenceResult:
    [result] = found[request.request_id]
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.PROMPT_TOO_LONG and not result.error.retryable, result.error
    assert result.produced_by == by, result
    return result


async def test_over_length_cjk_and_code_prompts_end_prompt_too_long_where_first_known(
    bus_settings: BusSettings, services: list[ServiceProc]
) -> None:
    await ensure_catalog(bus_settings)
    topics = t.Topics(bus_settings.topic_prefix)
    bus = await Bus.start(bus_settings, t.CLIENT)
    try:
        spec = ModelSpec(name=SPECCED, max_model_len=MAX_MODEL_LEN, tokenizer=TEKKEN)
        await bus.publisher.publish(topics.name(t.MODELS), spec, key=SPECCED)
    finally:
        await bus.stop()
    services.append(ServiceProc("llmbus_services.router", bus_settings).start())
    services.append(ServiceProc("llmbus_services.scheduler", bus_settings).start())
    for worker_id, model in (("w1", SPECCED), ("w2", UNSPECCED)):
        env = {
            "LLMBUS_WORKER_WORKER_ID": worker_id,
            "LLMBUS_WORKER_MODEL": model,
            "LLMBUS_WORKER_SIM_SPEEDUP": "50",
            "LLMBUS_WORKER_TOKENIZER": TEKKEN,
        }
        services.append(ServiceProc("llmbus_services.engine_worker", bus_settings, name=worker_id, env=env).start())
    # while the services start (each loads the tokenizer too): the prompts are what the test says they are
    tekken = load_tokenizer(TEKKEN)
    cjk, code = _text_of("cjk", 8000), _text_of("code", 16000)
    for text in (cjk, code):  # too long for the model's tokenizer only
        assert math.ceil(len(text) / 4) + MAX_TOKENS < MAX_MODEL_LEN < tekken.count(text) + MAX_TOKENS
    # For the model without a spec: the estimate fits the window exactly, the real count does not.
    near = _text_of("code", 24000, skip_lang="json")
    rendered = f"<|user|>\n{near}\n<|assistant|>\n"
    near_max_tokens = MAX_MODEL_LEN - estimate_tokens(f"<|user|>\n{near}\n") - estimate_tokens("<|assistant|>\n")
    assert near_max_tokens > 0 and tekken.count(rendered) + near_max_tokens > MAX_MODEL_LEN

    await wait_workers_ready(bus_settings, {"w1", "w2"})
    results = await TopicTail(bus_settings, topics.name(t.RESULTS)).start()

    requests = {
        "cjk": _chat(SPECCED, cjk, MAX_TOKENS),
        "code": InferenceRequest(model=SPECCED, max_tokens=MAX_TOKENS, prompt=code),
        "near": _chat(UNSPECCED, near, near_max_tokens),
        "fits": _chat(SPECCED, cjk[:500], 8),
    }
    # "never retried": a retry or a second refusal would come before a sentinel sent once every request
    # has its result, down the path the "near" request took (router, scheduler, w2).
    async with LlmbusClient(bus_settings) as client:
        for request in requests.values():
            await client.send(request)

        async def sentinel() -> str:
            ping = _chat(UNSPECCED, "ping", 8)
            await client.send(ping)
            return ping.request_id

        found = await results_then_sentinel(bus_settings, {r.request_id for r in requests.values()}, results, sentinel)
    await results.stop()

    for name in ("cjk", "code"):
        result = _refused(found, requests[name], "router")
        assert TEKKEN in result.error.message, "the refusal says it counted with the model's tokenizer"  # type: ignore[union-attr]
    _refused(found, requests["near"], "scheduler")  # after one attempt, with the worker's count
    [ok] = found[requests["fits"].request_id]
    assert ok.status == ResultStatus.OK
    assert ok.usage.prompt_tokens == tekken.count(requests["fits"].prompt_text()), "the worker counts alike"
