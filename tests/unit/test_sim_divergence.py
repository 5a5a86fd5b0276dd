"""The sim's answer-quality knob: divergence 0 is the reference answer, more divergence drifts from it."""

from __future__ import annotations

from llmbus_services.engine_worker.adapters.engines.sim.text import AnswerText
from llmbus_services.shadow_comparator.core.compare import rouge_l_f1


def answer(prompt: str, divergence: float, model: str, tokens: int = 64) -> str:
    text = AnswerText(prompt, None, divergence, model)
    return "".join(text.next_token() for _ in range(tokens))


def test_no_divergence_is_the_same_answer_for_every_model() -> None:
    assert answer("p", 0.0, "a") == answer("p", 0.0, "b")


def test_divergence_lowers_similarity_deterministically() -> None:
    reference = answer("why kafka", 0.0, "ctrl")
    slight = rouge_l_f1(reference, answer("why kafka", 0.05, "good"))
    heavy = rouge_l_f1(reference, answer("why kafka", 0.7, "bad"))
    assert heavy < 0.6 < 0.85 < slight < 1.0
    assert answer("why kafka", 0.7, "bad") == answer("why kafka", 0.7, "bad")
