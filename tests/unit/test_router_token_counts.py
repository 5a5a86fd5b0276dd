"""The router counts a prompt once, with the target model's tokenizer where a ModelSpec names one and
the per-script estimate elsewhere, and refuses what does not fit as a final prompt_too_long."""

from __future__ import annotations

import json
from pathlib import Path

from llmbus.contract.messages import ChatMessage, ErrorCode, InferenceRequest, ModelSpec
from llmbus.tokens import load_tokenizer
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.pipeline import RouterCore

TEKKEN = "pkg:mistral_common/data/tekken_240911.json"
MODEL = "sim-llama-8b"  # 8192 tokens in the shipped policy
CORPUS = Path(__file__).resolve().parents[2] / "data" / "tokens" / "corpus.jsonl"


def _zh(chars: int) -> str:
    one = "".join(
        json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines() if '"zh"' in line
    )
    return (one * (chars // len(one) + 1))[:chars]


def _core(tokenizer: str | None = None) -> RouterCore:
    core = RouterCore(load_policy(), build_scorer("heuristic"))
    if tokenizer is not None:
        core.catalog.apply_spec(ModelSpec(name=MODEL, max_model_len=8192, tokenizer=tokenizer))
    return core


def _chat(text: str, max_tokens: int) -> InferenceRequest:
    return InferenceRequest(model=MODEL, max_tokens=max_tokens, messages=[ChatMessage(role="user", content=text)])


async def test_over_length_chinese_is_refused_by_the_estimate_where_4_chars_per_token_admitted_it() -> None:
    text = _zh(7000)  # 1,750 tokens at 4 characters each; ~6,500 for a real tokenizer
    assert len(text) / 4 + 2000 < 8192 < load_tokenizer(TEKKEN).count(text) + 2000
    out = await _core().route(_chat(text, 2000))
    assert out.routed is None and out.result is not None and out.result.error is not None
    assert out.result.error.code == ErrorCode.PROMPT_TOO_LONG and not out.result.error.retryable
    assert "estimated" in out.result.error.message


async def test_a_model_spec_tokenizer_counts_the_prompt_once_and_the_count_travels() -> None:
    text = _zh(3000)
    out = await _core(TEKKEN).route(_chat(text, 100))
    assert out.routed is not None and out.routed.prompt_tokenizer == TEKKEN
    real = load_tokenizer(TEKKEN).count(out.routed.request.prompt_text())
    assert abs(out.routed.prompt_tokens_est - real) <= 3  # per-turn counts: within a token per piece
    long_text = _zh(8000)
    assert load_tokenizer(TEKKEN).count(long_text) + 1500 > 8192
    refused = await _core(TEKKEN).route(_chat(long_text, 1500))
    assert refused.result is not None and refused.result.error is not None
    assert refused.result.error.code == ErrorCode.PROMPT_TOO_LONG and TEKKEN in refused.result.error.message


async def test_a_tokenizer_that_is_not_here_falls_back_to_the_estimate() -> None:
    out = await _core("/nonexistent/tokenizer.json").route(_chat("hello there", 10))
    assert out.routed is not None and out.routed.prompt_tokenizer is None and out.routed.prompt_tokens_est > 0
