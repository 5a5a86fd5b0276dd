"""The scheduler keeps the router's prompt count; it counts only a request that comes without one."""

from __future__ import annotations

from llmbus.contract.messages import InferenceRequest, RoutedRequest
from llmbus.tokens import estimate_tokens, load_tokenizer
from llmbus_services.scheduler.core.types import SchedRequest

TEKKEN = "pkg:mistral_common/data/tekken_240911.json"
TEXT = "调度器为每个工作节点维护一个简单的视图"


def _routed(prompt_tokens_est: int) -> RoutedRequest:
    return RoutedRequest(request=InferenceRequest(prompt=TEXT), model="m", prompt_tokens_est=prompt_tokens_est)


def test_the_routers_count_is_carried_not_recounted() -> None:
    assert SchedRequest.from_routed(_routed(123), 0, tokenizer=TEKKEN).prompt_tokens == 123


def test_a_request_without_a_count_is_counted_with_the_models_tokenizer_else_estimated() -> None:
    assert SchedRequest.from_routed(_routed(0), 0, tokenizer=TEKKEN).prompt_tokens == load_tokenizer(TEKKEN).count(TEXT)
    assert SchedRequest.from_routed(_routed(0), 0).prompt_tokens == estimate_tokens(TEXT)
