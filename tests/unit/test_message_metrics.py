"""The quality and user-experience series the dashboards read, counted off published messages:
session turns by outcome, feedback scores, shadow similarity and agreement."""

from __future__ import annotations

from prometheus_client import REGISTRY

from llmbus.bus.message_metrics import observe_published
from llmbus.contract.messages import Comparison, Feedback, FinishReason, InferenceResult, PairSide, ResultStatus
from llmbus.observability.metric_children import MODEL_LABELS


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _turn(status: ResultStatus, finish: FinishReason | None, session: str | None = "s-1", shadow: bool = False):
    return InferenceResult(
        request_id="r",
        tenant="a",
        status=status,
        finish_reason=finish,
        model="m-turns",
        session_id=session,
        shadow=shadow,
    )


def test_session_turns_count_by_outcome_only_with_a_session() -> None:
    MODEL_LABELS.learn(["m-turns"])  # a model this process knows (else it counts as `other`)
    before = {
        o: _value("llmbus_session_turns_total", model="m-turns", outcome=o)
        for o in ("completed", "truncated", "failed")
    }
    observe_published("router", _turn(ResultStatus.OK, FinishReason.STOP))
    observe_published("router", _turn(ResultStatus.OK, FinishReason.STOP))
    observe_published("router", _turn(ResultStatus.OK, FinishReason.LENGTH))
    observe_published("router", _turn(ResultStatus.ERROR, FinishReason.ERROR))
    observe_published("router", _turn(ResultStatus.OK, FinishReason.STOP, session=None))  # no session: no turn
    observe_published("router", _turn(ResultStatus.OK, FinishReason.STOP, shadow=True))  # a shadow copy: no turn
    after = {o: _value("llmbus_session_turns_total", model="m-turns", outcome=o) for o in before}
    assert {o: after[o] - before[o] for o in before} == {"completed": 2, "truncated": 1, "failed": 1}


def test_feedback_scores_are_a_histogram() -> None:
    count, total = _value("llmbus_feedback_score_count"), _value("llmbus_feedback_score_sum")
    low = _value("llmbus_feedback_score_bucket", le="0.3")
    for score in (0.2, 0.9, 1.0):
        observe_published("gateway", Feedback(request_id="r", tenant="a", score=score))
    assert _value("llmbus_feedback_score_count") - count == 3
    assert abs(_value("llmbus_feedback_score_sum") - total - 2.1) < 1e-9
    assert _value("llmbus_feedback_score_bucket", le="0.3") - low == 1


def _comparison(similarity: float | None) -> Comparison:
    side = PairSide(request_id="r")
    return Comparison(
        comparison_id="c", experiment_id="exp-m", request_id="r", control=side, candidate=side, similarity=similarity
    )


def test_comparisons_count_agreement_and_observe_similarity() -> None:
    outcomes = ("agree", "disagree", "failed")
    before = {o: _value("llmbus_comparisons_total", experiment="exp-m", outcome=o) for o in outcomes}
    n = _value("llmbus_comparison_similarity_count", experiment="exp-m")
    for similarity in (0.9, 0.5, 0.1, None):
        observe_published("shadow-comparator", _comparison(similarity))
    after = {o: _value("llmbus_comparisons_total", experiment="exp-m", outcome=o) for o in outcomes}
    assert {o: after[o] - before[o] for o in outcomes} == {"agree": 2, "disagree": 1, "failed": 1}
    assert _value("llmbus_comparison_similarity_count", experiment="exp-m") - n == 3  # a failed side has none
