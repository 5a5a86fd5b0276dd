"""One primary (control) result against its shadow (candidate): deltas, similarity, format checks.

Similarity is ROUGE-L F1 over whitespace tokens, computed with rapidfuzz's LCSseq (a
well-kept C++ implementation of the longest common subsequence): 1.0 for identical
answers, 0.0 for answers with no token in common in order.

The comparator sees results, not requests: JSON counts as asked for when the control's
answer is a JSON object or array (its model was asked in a way that produced one), so the
candidate is held to the same format.
"""

from __future__ import annotations

import json
import re

from rapidfuzz.distance import LCSseq

from llmbus.contract.messages import Comparison, FormatCheck, InferenceResult, PairSide, ResultStatus

SIMILARITY_METRIC = "rouge_l_f1"

_REFUSAL = re.compile(
    r"^\s*(i'?m sorry|i am sorry|i can(?:'|no)t (?:help|assist|comply|do that)|i cannot (?:help|assist|comply)"
    r"|i(?:'m| am) (?:not able|unable) to|as an ai\b)",
    re.IGNORECASE,
)


def rouge_l_f1(reference: str, candidate: str) -> float:
    ref, cand = reference.split(), candidate.split()
    if not ref and not cand:
        return 1.0
    if not ref or not cand:
        return 0.0
    lcs = LCSseq.similarity(ref, cand)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def looks_like_json(text: str) -> bool:
    stripped = text.lstrip()
    return stripped.startswith("{") or stripped.startswith("[")


def json_valid(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def check_format(result: InferenceResult, json_expected: bool) -> FormatCheck:
    ok = result.status == ResultStatus.OK
    text = result.text
    return FormatCheck(
        json_expected=json_expected,
        json_valid=json_valid(text) if json_expected and ok else None,
        empty=ok and not text.strip(),
        truncated=result.finish_reason is not None and result.finish_reason.value == "length",
        refusal=ok and bool(_REFUSAL.match(text)),
    )


def error_class(result: InferenceResult) -> str:
    if result.status == ResultStatus.OK:
        return "ok"
    return result.error.code.value if result.error is not None else "error"


def side_of(result: InferenceResult, json_expected: bool) -> PairSide:
    return PairSide(
        request_id=result.request_id,
        model=result.model,
        status=result.status.value,
        error_class=error_class(result),
        finish_reason=result.finish_reason.value if result.finish_reason else None,
        ttft_ms=result.timings.ttft_ms,
        total_ms=result.timings.total_ms,
        completion_tokens=result.usage.completion_tokens,
        format=check_format(result, json_expected),
    )


def _delta(candidate: float | None, control: float | None) -> float | None:
    return None if candidate is None or control is None else round(candidate - control, 3)


def compare(experiment_id: str, primary: InferenceResult, shadow: InferenceResult) -> Comparison:
    json_expected = primary.status == ResultStatus.OK and looks_like_json(primary.text)
    control, candidate = side_of(primary, json_expected), side_of(shadow, json_expected)
    both_ok = primary.status == ResultStatus.OK and shadow.status == ResultStatus.OK
    return Comparison(
        comparison_id=f"{primary.request_key}:{experiment_id}",
        experiment_id=experiment_id,
        request_id=primary.request_id,
        control=control,
        candidate=candidate,
        ttft_delta_ms=_delta(candidate.ttft_ms, control.ttft_ms),
        total_delta_ms=_delta(candidate.total_ms, control.total_ms),
        length_delta_tokens=candidate.completion_tokens - control.completion_tokens,
        similarity=round(rouge_l_f1(primary.text, shadow.text), 4) if both_ok else None,
        similarity_metric=SIMILARITY_METRIC,
        release=shadow.release,
    )
