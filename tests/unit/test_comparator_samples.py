"""Which results are a variant's samples: only answers (and serving errors) of its own model."""

from __future__ import annotations

import pytest

from llmbus.contract.messages import ErrorCode, ErrorInfo, InferenceResult, ResultStatus
from llmbus.domain.lifecycle import create, to_step
from llmbus_services.shadow_comparator.core.samples import not_a_sample, variant_model

EXP = to_step(create("e", "ctrl", "cand"), 2)


def answer(**kw: object) -> InferenceResult:
    fields: dict[str, object] = {"request_id": "r", "tenant": "t", "status": ResultStatus.OK, "model": "cand"}
    return InferenceResult.model_validate(fields | {"route_reason": "rule:default"} | kw)


def error(code: ErrorCode) -> InferenceResult:
    return answer(status=ResultStatus.ERROR, error=ErrorInfo.of(code, "x"))


@pytest.mark.parametrize(
    ("result", "why"),
    [
        (answer(), None),
        (answer(route_reason="coalesce_fallback:timeout:rule:default"), None),  # it generated after all
        (error(ErrorCode.DEADLINE_EXCEEDED), None),
        (error(ErrorCode.MODEL_UNAVAILABLE), None),  # the candidate has no worker: its error
        (answer(cached=True, route_reason="cache_hit:rule:default"), "not_generated"),
        (answer(route_reason="semantic_hit:0.970:rule:default"), "not_generated"),
        (answer(route_reason="coalesced:r0:rule:default"), "not_generated"),
        (answer(model="ctrl", route_reason="fallback:cand->ctrl:model_unavailable"), "other_model"),
        (answer(model="small"), "other_model"),
        (error(ErrorCode.RATE_LIMITED), "caller_error"),
        (error(ErrorCode.INVALID_REQUEST), "caller_error"),
        (error(ErrorCode.OVER_BUDGET), "caller_error"),
    ],
)
def test_not_a_sample(result: InferenceResult, why: str | None) -> None:
    assert not_a_sample(result, variant_model(EXP, "candidate")) == why


def test_variant_model_from_the_experiment() -> None:
    assert (variant_model(EXP, "control"), variant_model(EXP, "candidate")) == ("ctrl", "cand")
    assert variant_model(None, "candidate") is None and variant_model(EXP, "other") is None
