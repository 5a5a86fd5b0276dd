"""Every path that makes a final result stamps the request's facts on it (session, user, category, tier,
route reason), and cost-accounting copies them onto the cost record: results and costs are analysed
alone, without a join with the prompts on llm.requests."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import (
    CostRecord,
    Dispatch,
    ErrorCode,
    Experiment,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    RoutedRequest,
    Usage,
)
from llmbus.security.tenancy import user_ref
from llmbus.settings import BusSettings
from llmbus_services.cost_accounting.core.costing import price_result
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_services.engine_worker.adapters.engines.openai_http import upstream_error
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.coalesce import follower_answer, follower_error
from llmbus_services.router.core.config import RouterPolicy, load_policy
from llmbus_services.router.core.experiments import ExperimentBook
from llmbus_services.router.core.ports import CachedAnswer
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_router_authorise import FakeBus as AuthoriseBus
from tests.unit.test_router_authorise import handlers_for
from tests.unit.test_router_failures import EveryTopicExists, UnreachableRedisCore
from tests.unit.test_router_pipeline import FakeCache, FakeLimiter, core
from tests.unit.test_worker_request_errors import FakeBus, RecordingPublisher, ScriptedEngine, worker

SALT = "deployment-salt"


def ask(**fields: object) -> InferenceRequest:
    base: dict[str, object] = {
        "prompt": "2+2?",
        "temperature": 0.0,
        "tenant": "acme",
        "session_id": "s-1",
        "user_id": "alice",
        "category": "chat",
    }
    return InferenceRequest(**(base | fields))  # type: ignore[arg-type]


def hashing_policy(tenant: str = "acme") -> RouterPolicy:
    raw = load_policy().model_dump(mode="json")
    raw["tenants"][tenant] = {"hash_user_ids": True}
    return RouterPolicy.model_validate(raw)


def facts_of(result: InferenceResult | CostRecord) -> tuple[str | None, ...]:
    return (result.session_id, result.user_id, result.category, result.tier)


async def test_a_routed_request_carries_its_tier_and_user() -> None:
    out = await core().route(ask(complexity=0.95))
    assert out.routed is not None and out.routed.model == "gpt-4.1"
    assert out.routed.tier == "strong" and out.routed.user_ref == "alice"
    assert out.routed.facts() == {
        "session_id": "s-1",
        "user_id": "alice",
        "category": "chat",
        "tier": "strong",
        "route_reason": "rule:complexity_high",
        "release": None,
        "shadowed_by": [],  # no shadow experiment mirrored it
    }


async def test_a_tenant_that_asks_gets_hmac_user_ids_others_keep_theirs() -> None:
    c = core(hashing_policy(), user_id_salt=SALT)
    out = await c.route(ask())
    expected = hmac.new(SALT.encode(), b"alice", hashlib.sha256).hexdigest()
    assert out.routed is not None and out.routed.user_ref == expected
    assert out.routed.request.user_id == "alice"  # the engine and the prompt log keep the real one
    other = await c.route(ask(tenant="globex"))
    assert other.routed is not None and other.routed.user_ref == "alice"
    anonymous = await c.route(ask(user_id=None))
    assert anonymous.routed is not None and anonymous.routed.user_ref is None


def test_hashing_without_a_salt_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="user_id_salt"):
        core(hashing_policy())
    with pytest.raises(ValueError, match="salt"):
        user_ref("alice", hashed=True, salt="")


async def test_a_refusal_carries_the_facts_but_no_tier() -> None:
    c = core(hashing_policy(), limiter=FakeLimiter(allow=False), user_id_salt=SALT)
    out = await c.route(ask())
    assert out.result is not None and out.result.error is not None
    assert out.result.error.code == ErrorCode.RATE_LIMITED
    assert facts_of(out.result) == ("s-1", user_ref("alice", hashed=True, salt=SALT), "chat", None)
    assert out.result.route_reason == "refused:rate_limited"


async def test_a_cache_hit_carries_the_facts_and_its_own_route_reason() -> None:
    cache = FakeCache()
    c = core(cache=cache)
    request = ask()
    first = await c.route(request)
    assert first.routed is not None
    cache.entries[cache.pending[request.request_key]] = CachedAnswer(
        text="4", usage=Usage(prompt_tokens=3, completion_tokens=1), model="gpt-4.1-mini"
    )
    hit = await c.route(request.model_copy(update={"request_id": "second"}))
    assert hit.result is not None and hit.result.cached
    assert facts_of(hit.result) == ("s-1", "alice", "chat", "default")
    assert hit.result.route_reason == "cache_hit:default"


async def test_a_shadow_copy_carries_the_shadow_models_tier() -> None:
    book = ExperimentBook()
    book.apply(Experiment(experiment_id="sh", kind="shadow", shadow_model="sim-llama-8b", shadow_share=1.0))
    out = await core(experiments=book).route(ask())
    [shadow] = out.shadows
    assert shadow.tier == "sim" and shadow.user_ref == "alice" and shadow.facts()["session_id"] == "s-1"
    # the primary's result says it was mirrored (the comparator holds it for the copy's result)
    assert out.routed is not None and out.routed.facts()["shadowed_by"] == ["sh"]
    assert shadow.shadowed_by is None


def test_coalesced_followers_carry_their_own_facts() -> None:
    follower = RoutedRequest(request=ask(request_id="f1"), model="m", route_reason="default", tier="mid", user_ref="u")
    leader = InferenceResult(request_id="lead", tenant="acme", status=ResultStatus.OK, model="m", text="4")
    answered = follower_answer(follower, leader).result
    assert answered is not None and facts_of(answered) == ("s-1", "u", "chat", "mid")
    assert answered.route_reason == "coalesced:lead:default"
    failed = InferenceResult.model_validate(
        leader.model_dump() | {"status": "error", "error": {"code": "invalid_request", "message": "bad"}}
    )
    ended = follower_error(follower, failed).result
    assert ended is not None and facts_of(ended) == ("s-1", "u", "chat", "mid")


def dispatch_record(routed: RoutedRequest) -> ConsumerRecord:
    raw = Dispatch(routed=routed, worker_id="w1").to_bytes()
    return ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), [])


ROUTED = RoutedRequest(
    request=ask(request_id="r1", max_tokens=4),
    model="m",
    route_reason="rule:x",
    tier="small",
    user_ref="h",
    shadowed_by=["sh"],
)


async def test_the_workers_result_and_error_result_carry_the_facts() -> None:
    handlers, publisher = worker(ScriptedEngine())
    await handlers.on_dispatch(dispatch_record(ROUTED))
    [ok] = publisher.of(InferenceResult)
    assert ok.status == ResultStatus.OK and facts_of(ok) == ("s-1", "h", "chat", "small")
    assert ok.route_reason == "rule:x" and ok.shadowed_by == ["sh"]

    handlers, publisher = worker(ScriptedEngine(upstream_error(400, "bad request")))
    await handlers.on_dispatch(dispatch_record(ROUTED))
    [failed] = publisher.of(InferenceResult)
    assert failed.status == ResultStatus.ERROR and facts_of(failed) == ("s-1", "h", "chat", "small")
    assert failed.route_reason == "rule:x" and failed.shadowed_by == ["sh"]


async def test_the_routers_unroutable_and_refused_answers_carry_the_facts() -> None:
    publisher = RecordingPublisher()
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        UnreachableRedisCore(),
        None,  # type: ignore[arg-type]
        directory=EveryTopicExists(),
    )
    raw = ask(request_id="r1", reply_topic="llm.replies.acme").to_bytes()
    with pytest.raises(ConnectionError):
        await handlers.on_request(ConsumerRecord("x.llm.requests", 0, 0, 0, 0, b"r1", raw, None, 2, len(raw), []))
    [unroutable] = publisher.of(InferenceResult)
    assert facts_of(unroutable) == ("s-1", "alice", "chat", None) and unroutable.route_reason == "unroutable"

    bus = AuthoriseBus(RecordingPublisher(), BusSettings())
    raw = ask(request_id="r2", reply_topic="llm.nowhere").to_bytes()  # no such topic: refused
    await handlers_for(bus, {"x.llm.tokens"}).on_request(
        ConsumerRecord("x.llm.requests", 0, 0, 0, 0, b"r2", raw, None, 2, len(raw), [])
    )
    [refused] = bus.publisher.of(InferenceResult)
    assert refused.error is not None and refused.error.code == ErrorCode.FORBIDDEN
    assert facts_of(refused) == ("s-1", "alice", "chat", None) and refused.route_reason == "refused:forbidden"


@pytest.mark.parametrize("cached", [False, True])
def test_cost_records_copy_the_results_facts(cached: bool) -> None:
    result = InferenceResult(
        request_id="r1",
        tenant="acme",
        status=ResultStatus.OK,
        model="gpt-4.1-mini",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        cached=cached,
        route_reason="default",
        session_id="s-1",
        user_id="h",
        category="chat",
        tier="default",
    )
    record = price_result(result, load_pricebook())
    assert isinstance(record, CostRecord)
    assert facts_of(record) == ("s-1", "h", "chat", "default") and record.route_reason == "default"
