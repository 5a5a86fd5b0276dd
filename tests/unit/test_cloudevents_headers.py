"""CloudEvents binary-mode headers on what analytics reads, parsed by the CloudEvents SDK."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from cloudevents.core.bindings.kafka import KafkaMessage, from_binary_event

from llmbus.bus import headers as hdr
from llmbus.contract.messages import TokenChunk
from tests.contract_samples import SAMPLES, T0_MS, Sample


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.topic)
def test_every_analytics_message_is_a_cloudevent(sample: Sample) -> None:
    headers = hdr.outgoing(sample.message, "cost-accounting")
    event = from_binary_event(KafkaMessage(headers=dict(headers), key=sample.key, value=sample.message.to_bytes()))
    assert event.get_specversion() == "1.0"
    assert event.get_id() == sample.ce_id
    assert event.get_type() == sample.ce_type
    assert event.get_source() == "/llmbus/cost-accounting"
    assert event.get_subject() == sample.ce_subject
    assert event.get_time() == datetime.fromtimestamp(T0_MS / 1000, UTC)
    assert event.get_datacontenttype() == "application/json"
    assert event.get_data() == sample.message.model_dump(mode="json", exclude_none=True)
    assert dict(headers)[hdr.SCHEMA] == sample.message.schema_name().encode()  # llmbus's own headers stay


def test_the_same_record_sent_again_has_the_same_event_id() -> None:
    message = SAMPLES[0].message
    assert dict(hdr.outgoing(message, "router"))["ce_id"] == dict(hdr.outgoing(message, "router"))["ce_id"]


def test_messages_analytics_does_not_read_carry_no_cloudevent_headers() -> None:
    chunk = TokenChunk(request_id="r1", tenant="acme", seq=0, delta="x")
    names = [name for name, _ in hdr.outgoing(chunk, "engine-worker")]
    assert not [name for name in names if name.startswith("ce_") or name == "content-type"]
