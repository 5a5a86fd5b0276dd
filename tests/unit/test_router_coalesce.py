"""Request coalescing, the pure part: who leads, what a follower gets, and the policy's validation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus.contract.messages import (
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    ToolCall,
    Usage,
)
from llmbus_services.router.core.coalesce import (
    FollowerVerdict,
    follower_answer,
    outcome_for,
    verdict_on,
)
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import CoalescePolicy, RouterPolicy, load_policy
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.core.ports import CachedAnswer


class MemoryCache:
    async def lookup(self, key: str, pending_id: str | None = None) -> CachedAnswer | None:
        return None


class MemoryCoalescer:
    """The join rule of RedisCoalescer without Redis: the first of a key leads, the rest follow it."""

    def __init__(self) -> None:
        self.leaders: dict[str, str] = {}
        self.followers: dict[str, list[str]] = {}

    async def join(self, key: str, routed: RoutedRequest) -> str | None:
        leader = self.leaders.setdefault(key, routed.request_id)
        if leader == routed.request_id:
            return None
        self.followers.setdefault(leader, []).append(routed.request_id)
        return leader


def core_with(coalescer: MemoryCoalescer, policy: RouterPolicy | None = None) -> RouterCore:
    return RouterCore(policy or load_policy(), build_scorer("heuristic"), cache=MemoryCache(), coalescer=coalescer)


def ask(request_id: str, **fields: object) -> InferenceRequest:
    base: dict[str, object] = {"prompt": "What is Kafka?", "temperature": 0.0, "tenant": "acme", "max_tokens": 32}
    return InferenceRequest(request_id=request_id, **(base | fields))  # type: ignore[arg-type]


def leader_ok(request_id: str = "lead", tenant: str = "acme") -> InferenceResult:
    return InferenceResult(
        request_id=request_id,
        tenant=tenant,
        status=ResultStatus.OK,
        model="m",
        text="Kafka is a log.",
        finish_reason=FinishReason.STOP,
        usage=Usage(prompt_tokens=7, completion_tokens=5),
        worker_id="w1",
    )


def leader_failed(code: ErrorCode) -> InferenceResult:
    return InferenceResult(
        request_id="lead", tenant="acme", status=ResultStatus.ERROR, error=ErrorInfo.of(code, "it failed")
    )


def follower(request_id: str = "f1") -> RoutedRequest:
    return RoutedRequest(request=ask(request_id), model="m", route_reason="default", received_at_ms=1)


async def test_identical_deterministic_requests_follow_the_first() -> None:
    coalescer = MemoryCoalescer()
    core = core_with(coalescer)
    first = await core.route(ask("a"))
    second = await core.route(ask("b"))
    assert first.routed is not None and first.parked_behind is None
    assert second.routed is None and second.result is None and second.parked_behind == "a"
    assert coalescer.followers == {"a": ["b"]}


async def test_other_tenants_sampled_or_different_requests_are_never_coalesced() -> None:
    coalescer = MemoryCoalescer()
    core = core_with(coalescer)
    await core.route(ask("a"))
    for other in (
        ask("t", tenant="globex"),  # same bytes, another tenant: its own key
        ask("s", temperature=0.7),  # sampled: not cacheable, so not coalescible
        ask("p", prompt="What is Redis?"),
        ask("m", max_tokens=33),
    ):
        outcome = await core.route(other)
        assert outcome.routed is not None and outcome.parked_behind is None, other.request_id
    assert coalescer.followers == {}


async def test_coalescing_off_or_cache_off_routes_every_request() -> None:
    for section in ({"coalesce": {"enabled": False}}, {"cache": {"enabled": False}}):
        raw = load_policy().model_dump(mode="json") | section
        core = core_with(MemoryCoalescer(), RouterPolicy.model_validate(raw))
        assert (await core.route(ask("a"))).routed is not None
        assert (await core.route(ask("b"))).routed is not None, section


def test_verdicts() -> None:
    policy = CoalescePolicy()
    assert verdict_on(leader_ok(), policy) == FollowerVerdict.ANSWER
    assert verdict_on(leader_failed(ErrorCode.PROMPT_TOO_LONG), policy) == FollowerVerdict.ERROR
    for code in (ErrorCode.DEADLINE_EXCEEDED, ErrorCode.WORKER_LOST, ErrorCode.CANCELLED, ErrorCode.MAX_ATTEMPTS):
        assert verdict_on(leader_failed(code), policy) == FollowerVerdict.GENERATE, code
    shares_deadlines = CoalescePolicy(share_error_codes=[ErrorCode.DEADLINE_EXCEEDED])
    assert verdict_on(leader_failed(ErrorCode.DEADLINE_EXCEEDED), shares_deadlines) == FollowerVerdict.ERROR


def test_a_follower_gets_its_own_complete_stream_billed_as_a_hit() -> None:
    outcome = follower_answer(follower("f1"), leader_ok())
    result = outcome.result
    assert result is not None and outcome.routed is None
    assert result.request_id == "f1" and result.tenant == "acme" and result.status == ResultStatus.OK
    assert result.cached and result.worker_id is None and result.produced_by == "router"
    assert result.text == "Kafka is a log." and result.usage == Usage(prompt_tokens=7, completion_tokens=5)
    assert result.route_reason == "coalesced:lead:default"
    [chunk] = outcome.content_chunks
    assert chunk.request_id == "f1" and chunk.seq == 0 and chunk.delta == result.text and not chunk.final
    assert outcome.last_seq == 0  # the final chunk follows as seq 1 (publish_result)


def test_a_leader_failure_ends_followers_by_its_kind() -> None:
    policy = CoalescePolicy()
    shared = outcome_for(follower(), leader_failed(ErrorCode.INVALID_REQUEST), policy)
    assert shared.result is not None and shared.routed is None
    assert shared.result.status == ResultStatus.ERROR and not shared.result.cached
    assert shared.result.error is not None and shared.result.error.code == ErrorCode.INVALID_REQUEST
    assert shared.result.request_id == "f1"

    alone = outcome_for(follower(), leader_failed(ErrorCode.DEADLINE_EXCEEDED), policy)
    assert alone.result is None and alone.routed is not None
    assert alone.routed.request_id == "f1" and alone.routed.model == "m"
    assert alone.routed.route_reason == "coalesce_fallback:leader_failed:deadline_exceeded:default"


def test_a_leader_that_called_tools_sends_its_followers_to_their_own_generation() -> None:
    call = {"id": "call_1", "function": {"name": "lookup", "arguments": "{}"}}
    leader = leader_ok().model_copy(
        update={"text": "", "finish_reason": FinishReason.TOOL_CALLS, "tool_calls": [ToolCall.model_validate(call)]}
    )
    assert verdict_on(leader, CoalescePolicy()) == FollowerVerdict.GENERATE
    alone = outcome_for(follower(), leader, CoalescePolicy())
    assert alone.result is None and alone.routed is not None
    assert alone.routed.route_reason == "coalesce_fallback:leader_tool_calls:default"


def test_policy_is_validated() -> None:
    with pytest.raises(ValidationError, match="max_wait_s"):
        CoalescePolicy(lead_ttl_s=60, max_wait_s=30)
    with pytest.raises(ValidationError):
        CoalescePolicy.model_validate({"share_error_codes": ["no_such_code"]})
    with pytest.raises(ValidationError):
        CoalescePolicy.model_validate({"enabled": True, "typo": 1})
    with pytest.raises(ValidationError):
        CoalescePolicy(sweep_interval_s=0)
    assert load_policy().coalesce.enabled  # on in the default policy
