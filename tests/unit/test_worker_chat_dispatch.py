"""What the worker hands its engine for a chat: the messages themselves (roles, order), the request's
priority, and what the engine reports back (preemptions, cached prompt tokens) in the result."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiokafka.structs import ConsumerRecord

from llmbus.contract.messages import ChatMessage, Dispatch, InferenceRequest, InferenceResult, RoutedRequest
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest
from tests.unit.test_worker_request_errors import ScriptedEngine, worker

CHAT = [
    ChatMessage(role="system", content="be brief"),
    ChatMessage(role="user", content="hi"),
    ChatMessage(role="assistant", content="hello"),
    ChatMessage(role="tool", content='{"ok": true}'),
    ChatMessage(role="user", content="and now?"),
]


class RecordingEngine(ScriptedEngine):
    def __init__(self) -> None:
        super().__init__(tokens=0)
        self.requests: list[EngineRequest] = []

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.requests.append(request)
        yield EngineOutput("ok", 1, 7, 1, cached_prompt_tokens=3, finished=True, finish_reason="stop", preemptions=2)


def chat_record(request: InferenceRequest) -> ConsumerRecord:
    raw = Dispatch(routed=RoutedRequest(request=request, model="m"), worker_id="w1").to_bytes()
    return ConsumerRecord("x.llm.dispatch.w1", 0, 0, 0, 0, None, raw, None, 0, len(raw), [])


async def test_a_chat_reaches_the_engine_as_its_messages_with_its_priority() -> None:
    engine = RecordingEngine()
    handlers, publisher = worker(engine)
    request = InferenceRequest(request_id="c1", messages=CHAT, max_tokens=4, priority=3)
    await handlers.on_dispatch(chat_record(request))

    [seen] = engine.requests
    assert seen.messages == tuple(CHAT)  # every turn, in order, system and tool included
    assert seen.prompt == request.prompt_text()  # engines without a chat format still get text
    assert seen.priority == 3
    [result] = publisher.of(InferenceResult)
    assert result.preemptions == 2 and result.usage.cached_prompt_tokens == 3


async def test_a_prompt_request_carries_no_messages() -> None:
    engine = RecordingEngine()
    handlers, _ = worker(engine)
    await handlers.on_dispatch(chat_record(InferenceRequest(request_id="p1", prompt="complete me", max_tokens=4)))
    [seen] = engine.requests
    assert seen.messages == () and seen.prompt == "complete me"
