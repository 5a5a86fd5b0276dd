"""JSON nested deeper than the parser's stack is bad input (MALFORMED, a DLQ entry with that reason),
not an internal error with a traceback (issue 9, the hostile fuzz)."""

from __future__ import annotations

import pytest

from llmbus.bus import BadMessage, decode
from llmbus.contract.messages import ErrorCode, InferenceRequest
from tests.unit.test_bus_pure import record


@pytest.mark.parametrize("raw", [b"[" * 200_000, b'{"request_id": "r1", "metadata": ' + b'{"a":' * 100_000 + b"1"])
def test_json_nested_too_deep_is_a_malformed_message(raw: bytes) -> None:
    with pytest.raises(BadMessage) as bad:
        decode(record(raw), InferenceRequest)
    assert bad.value.code == ErrorCode.MALFORMED and "nested too deep" in bad.value.reason


def test_a_request_without_an_id_is_refused_where_the_id_is_required() -> None:
    raw = b'{"prompt": "no id", "max_tokens": 4}'
    assert decode(record(raw), InferenceRequest).request_id  # a default id is filled in elsewhere
    with pytest.raises(BadMessage) as bad:
        decode(record(raw), InferenceRequest, required=("request_id",))
    assert bad.value.code == ErrorCode.INVALID_REQUEST and bad.value.request_id is None
    assert "request_id: required" in bad.value.reason
