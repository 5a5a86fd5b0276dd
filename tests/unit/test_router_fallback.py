"""Fallback along the chain on model-level failures."""

from __future__ import annotations

from llmbus.contract.messages import ErrorCode, InferenceRequest, RoutedRequest
from llmbus.domain.fallback import fall_back


def routed() -> RoutedRequest:
    return RoutedRequest(
        request=InferenceRequest(prompt="x"), model="a", route_reason="rule:r", fallback_chain=["b", "c"]
    )


def test_next_model_on_unavailable_and_records_the_hop() -> None:
    nxt = fall_back(routed(), "a", ErrorCode.MODEL_UNAVAILABLE)
    assert nxt is not None
    assert (nxt.model, nxt.fallback_chain, nxt.route_reason) == ("b", ["c"], "fallback:a->b:model_unavailable")
    last = fall_back(nxt, "b", ErrorCode.OVER_CAPACITY)
    assert last is not None and last.model == "c" and last.route_reason == "fallback:b->c:over_capacity"
    assert fall_back(last, "c", ErrorCode.OVER_CAPACITY) is None  # chain spent


def test_skips_unavailable_models() -> None:
    nxt = fall_back(routed(), "a", ErrorCode.MODEL_UNAVAILABLE, is_available=lambda m: m != "b")
    assert nxt is not None and nxt.model == "c" and nxt.fallback_chain == []


def test_request_level_errors_do_not_fall_back() -> None:
    assert fall_back(routed(), "a", ErrorCode.INVALID_REQUEST) is None
    assert fall_back(routed(), "a", ErrorCode.RATE_LIMITED) is None  # the tenant's own limit holds everywhere


def test_a_prompt_over_the_window_falls_back_to_the_first_model_whose_window_fits() -> None:
    windows = {"b": 8_192, "c": 32_768}
    hop = fall_back(routed(), "a", ErrorCode.PROMPT_TOO_LONG, lambda m: windows.get(m, 0) >= 20_000)
    assert hop is not None and hop.model == "c" and hop.route_reason == "fallback:a->c:prompt_too_long"
    assert fall_back(routed(), "a", ErrorCode.PROMPT_TOO_LONG, lambda m: False) is None
