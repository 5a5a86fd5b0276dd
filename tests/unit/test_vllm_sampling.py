"""A request's sampling as vllm serve makes it: the request's value, else the model's generation config,
else vLLM's neutral; an unset max_tokens bounded by the window and the config's max_new_tokens."""

from __future__ import annotations

import pytest

from llmbus_services.engine_worker.core.engine import EngineRequest

pytest.importorskip("vllm")


def test_the_request_wins_then_the_model_then_vllms_neutral_values() -> None:
    from llmbus_services.engine_worker.adapters.engines.vllm_sampling import chosen_sampling

    model = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}
    chosen = chosen_sampling(EngineRequest("r", "p", max_tokens=4, temperature=0.1), model)
    assert chosen == {
        "temperature": 0.1,
        "top_p": 0.8,
        "top_k": 20,
        "min_p": 0.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.05,
    }


def test_an_unset_max_tokens_is_bounded_by_the_window_and_the_models_max_new_tokens() -> None:
    from llmbus_services.engine_worker.adapters.engines.vllm_sampling import max_tokens_for

    auto = EngineRequest("r", "p", max_tokens=4096, max_tokens_auto=True)
    assert max_tokens_for(auto, 29, 512, {}) == 483
    assert max_tokens_for(auto, 29, 512, {"max_tokens": 100}) == 100
    assert max_tokens_for(EngineRequest("r", "p", max_tokens=600), 29, 512, {"max_tokens": 100}) == 600  # as asked
