"""The router refuses a request before publishing anything to the reply topic it names."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import ErrorCode, InferenceRequest, InferenceResult, TokenChunk
from llmbus.contract.topics import Topics
from llmbus.settings import BusSettings
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import load_policy
from llmbus_services.router.core.pipeline import RouteOutcome, RouterCore
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_worker_request_errors import RecordingPublisher


@dataclass
class FakeBus:
    publisher: RecordingPublisher
    settings: BusSettings
    topics: Topics = field(default_factory=lambda: Topics("x."))
    service: str = "router"
    dead: list[tuple[str, str]] = field(default_factory=list)

    async def send_dead_letter(self, record: ConsumerRecord, code: str, reason: str, request_id: str | None) -> bool:
        self.dead.append((code, reason))
        return True


@dataclass
class Directory:
    existing: set[str]
    asked: list[str] = field(default_factory=list)

    async def exists(self, topic: str) -> bool:
        self.asked.append(topic)
        return topic in self.existing


class NeverRoutes(RouterCore):
    """The real core's policy (a refusal's result carries the request's facts from it), never routing."""

    def __init__(self) -> None:
        super().__init__(load_policy(), build_scorer("heuristic"))

    async def route(self, request: InferenceRequest, received_at_ms: int | None = None) -> RouteOutcome:
        raise AssertionError("a refused request must not be routed")


def handlers_for(bus: FakeBus, existing: set[str]) -> RouterHandlers:
    return RouterHandlers(bus, RouterSettings(), NeverRoutes(), None, directory=Directory(existing))  # type: ignore[arg-type]


def record(topic: str, request: InferenceRequest) -> ConsumerRecord:
    raw = request.to_bytes()
    return ConsumerRecord(topic, 0, 0, 0, 0, b"k", raw, None, 1, len(raw), [])


AUTH = BusSettings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_username="router", kafka_sasl_password="pw")  # type: ignore[arg-type]


async def test_dev_mode_a_missing_reply_topic_is_refused_without_a_send_to_it() -> None:
    bus = FakeBus(RecordingPublisher(), BusSettings())
    handlers = handlers_for(bus, {"x.llm.tokens"})
    await handlers.on_request(
        record("x.llm.requests", InferenceRequest(request_id="r1", prompt="p", reply_topic="llm.nope"))
    )
    assert all(topic != "x.llm.nope" for topic, _ in bus.publisher.sent)
    [result] = bus.publisher.of(InferenceResult)
    assert (
        result.error is not None
        and result.error.code == ErrorCode.FORBIDDEN
        and "does not exist" in result.error.message
    )
    assert [topic for topic, v in bus.publisher.sent if isinstance(v, TokenChunk)] == ["x.llm.tokens"]
    assert bus.dead and bus.dead[0][0] == ErrorCode.FORBIDDEN


async def test_auth_mode_a_body_claiming_another_tenant_is_answered_on_the_writers_topic() -> None:
    bus = FakeBus(RecordingPublisher(), AUTH)
    handlers = handlers_for(bus, {"x.llm.replies.acme", "x.llm.replies.globex"})
    claim = InferenceRequest(request_id="r2", prompt="p", tenant="globex", reply_topic="llm.replies.globex")
    await handlers.on_request(record("x.llm.requests.acme", claim))
    [result] = bus.publisher.of(InferenceResult)
    assert result.tenant == "acme" and result.error is not None and "claims tenant 'globex'" in result.error.message
    assert [topic for topic, v in bus.publisher.sent if isinstance(v, TokenChunk)] == ["x.llm.replies.acme"]


async def test_auth_mode_a_reply_into_a_foreign_namespace_is_refused() -> None:
    bus = FakeBus(RecordingPublisher(), AUTH)
    handlers = handlers_for(bus, {"x.llm.replies.acme", "x.llm.replies.globex"})
    steal = InferenceRequest(request_id="r3", prompt="p", tenant="acme", reply_topic="llm.replies.globex")
    await handlers.on_request(record("x.llm.requests.acme", steal))
    assert {topic for topic, _ in bus.publisher.sent} == {"x.llm.replies.acme", "x.llm.results"}


async def test_a_record_from_an_unknown_request_topic_is_answered_on_results_only() -> None:
    bus = FakeBus(RecordingPublisher(), AUTH)
    handlers = handlers_for(bus, {"x.llm.replies.globex"})
    odd = InferenceRequest(request_id="r4", prompt="p", tenant="globex", reply_topic="llm.replies.globex")
    await handlers.on_request(record("x.llm.requests.gw-odd", odd))
    assert [topic for topic, _ in bus.publisher.sent] == ["x.llm.results"]
