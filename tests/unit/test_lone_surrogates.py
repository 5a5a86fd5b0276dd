"""Lone surrogates in a request (JSON allows "\\udc80"; UTF-8 cannot carry it) end as a DLQ entry with
a reason, plus a final error result when the request id itself is clean; never a crash or a loop (issue 9)."""

from __future__ import annotations

import json

import pytest
from aiokafka.structs import ConsumerRecord

from llmbus.bus.dlq import dead_letter
from llmbus.contract.messages import DeadLetter, ErrorCode, InferenceResult
from llmbus_services.router.config import RouterSettings
from llmbus_services.router.flows import RouterHandlers
from tests.unit.test_router_answers_once import CacheHitCore, EveryTopicExists
from tests.unit.test_worker_request_errors import FakeBus, MemoryFence, RecordingPublisher


def raw_record(body: dict[str, object]) -> ConsumerRecord:
    raw = json.dumps(body).encode()  # the surrogate travels as a \\udc80 escape
    return ConsumerRecord("x.llm.requests", 0, 7, 0, 0, None, raw, None, 0, len(raw), [])


def router() -> tuple[RouterHandlers, RecordingPublisher, list[DeadLetter]]:
    publisher = RecordingPublisher()
    handlers = RouterHandlers(
        FakeBus(publisher),  # type: ignore[arg-type]
        RouterSettings(),
        CacheHitCore(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        fence=MemoryFence(),
        directory=EveryTopicExists(),
    )
    letters: list[DeadLetter] = []

    async def send_dead_letter(record: ConsumerRecord, code: str, reason: str, request_id: str | None) -> None:
        letter = dead_letter(record, code, reason, "router", request_id)
        letter.to_bytes()  # what the DLQ producer would write: must encode
        letters.append(letter)

    handlers.bus.send_dead_letter = send_dead_letter  # type: ignore[attr-defined]
    return handlers, publisher, letters


async def test_a_lone_surrogate_request_id_goes_to_the_dlq_with_a_reason_and_no_result() -> None:
    handlers, publisher, letters = router()
    await handlers.on_request(raw_record({"request_id": "sur\udc80abc", "prompt": "hi", "max_tokens": 4}))
    [letter] = letters
    assert letter.error_code == ErrorCode.INVALID_REQUEST and "request_id" in letter.error
    assert letter.request_id is None and letter.source_offset == 7
    assert publisher.sent == []  # no id a result could carry


@pytest.mark.parametrize("field", ["prompt", "user_id", "tenant"])
async def test_a_lone_surrogate_elsewhere_gets_the_client_one_error_result(field: str) -> None:
    handlers, publisher, letters = router()
    body: dict[str, object] = {"request_id": "r-sur", "prompt": "hi", "max_tokens": 4}
    body[field] = "lone \ud800 surrogate"
    await handlers.on_request(raw_record(body))
    [letter] = letters
    assert letter.error and letter.request_id == "r-sur"
    [result] = publisher.of(InferenceResult)
    assert result.request_id == "r-sur" and result.error is not None
    assert result.error.code == ErrorCode.INVALID_REQUEST
    result.to_bytes()  # the reason quotes no surrogate: the result can be written
