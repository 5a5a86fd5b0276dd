"""The evolution rule: tolerant readers inside, strict client input, additive-only schema changes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from aiokafka.structs import ConsumerRecord
from prometheus_client import REGISTRY

from llmbus.bus.codec import BadMessage, decode
from llmbus.contract import compat
from llmbus.contract.messages import (
    CostRecord,
    ErrorCode,
    Feedback,
    InferenceRequest,
    InferenceResult,
    ResultStatus,
    Usage,
)
from llmbus.contract.schemagen import message_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def record(value: bytes, topic: str = "llm.results") -> ConsumerRecord:
    return ConsumerRecord(topic, 0, 1, 0, 0, None, value, None, 0, len(value), [])


def unknown_fields_counted(schema: str) -> float:
    return REGISTRY.get_sample_value("llmbus_unknown_fields_total", {"schema": schema}) or 0.0


class NextCostRecord(CostRecord):
    """CostRecord as a later llmbus writes it: one optional field more (an additive change)."""

    region: str | None = None


def test_todays_record_reads_with_the_next_reader_and_back() -> None:
    today = CostRecord(request_id="r1", tenant="acme", model="m", cost_usd=0.25, cost_micro_usd=250_000)
    read_by_next = decode(record(today.to_bytes(), "llm.costs"), NextCostRecord)
    assert read_by_next.region is None and read_by_next.cost_micro_usd == 250_000

    later = NextCostRecord(**today.model_dump(), region="eu-west")
    before = unknown_fields_counted("CostRecord/1")
    read_today = decode(record(later.to_bytes(), "llm.costs"), CostRecord)
    assert read_today == today  # every field this reader knows, the unknown one dropped
    assert unknown_fields_counted("CostRecord/1") == before + 1


def test_unknown_nested_fields_are_dropped_and_counted() -> None:
    result = InferenceResult(
        request_id="r2", tenant="acme", status=ResultStatus.OK, usage=Usage(prompt_tokens=3, completion_tokens=4)
    )
    data = json.loads(result.to_bytes())
    data["usage"]["reasoning_tokens"] = 2
    data["served_region"] = "eu"
    before = unknown_fields_counted("InferenceResult/1")
    read = decode(record(json.dumps(data).encode()), InferenceResult)
    assert read == result
    assert unknown_fields_counted("InferenceResult/1") == before + 2


def test_an_unknown_field_does_not_hide_a_real_error() -> None:
    data = json.loads(InferenceResult(request_id="r3", tenant="acme", status=ResultStatus.OK).to_bytes())
    data |= {"served_region": "eu", "status": "nonsense"}
    with pytest.raises(BadMessage) as refused:
        decode(record(json.dumps(data).encode()), InferenceResult)
    assert refused.value.code == ErrorCode.INVALID_REQUEST and "status" in refused.value.reason


@pytest.mark.parametrize(
    "model, value",
    [
        (InferenceRequest, {"request_id": "r4", "tenant": "acme", "prompt": "hi", "tempreature": 0}),
        (Feedback, {"request_id": "r4", "tenant": "acme", "score": 1.0, "secret_flag": True}),
    ],
)
def test_client_input_stays_strict(model: type[InferenceRequest] | type[Feedback], value: dict[str, object]) -> None:
    with pytest.raises(BadMessage) as refused:
        decode(record(json.dumps(value).encode(), "llm.requests"), model)
    assert refused.value.code == ErrorCode.INVALID_REQUEST and "Extra inputs are not permitted" in refused.value.reason
    assert refused.value.request_id == "r4"


def test_generated_schemas_are_open_inside_and_closed_for_clients() -> None:
    internal = json.loads((SCHEMAS / "messages" / "InferenceResult.json").read_text())
    assert "additionalProperties" not in json.dumps(internal)
    assert internal["x-llmbus-schema-version"] == 1 and internal["$id"].endswith("/InferenceResult/1")
    client = json.loads((SCHEMAS / "messages" / "InferenceRequest.json").read_text())
    assert client["additionalProperties"] is False and client["x-llmbus-schema-version"] == 1


# --- the compatibility check (`make schemas-check`) ---


@pytest.fixture
def released(tmp_path: Path) -> Path:
    """A schemas/ tree whose released contract is the committed one."""
    shutil.copytree(SCHEMAS / "previous", tmp_path / "previous")
    shutil.copytree(SCHEMAS / "messages", tmp_path / "messages")
    return tmp_path


def write_cost_schema(tree: Path, schema: dict[str, object]) -> None:
    (tree / "messages" / "CostRecord.json").write_text(json.dumps(schema))


def test_committed_schemas_are_compatible_with_the_released_ones() -> None:
    assert compat.main(["--schemas", str(SCHEMAS)]) == 0


def test_an_additive_change_passes(released: Path) -> None:
    schema = message_schema(NextCostRecord)
    schema["$defs"]["CostKind"]["enum"].append("spot")  # type: ignore[index]
    write_cost_schema(released, schema)
    assert compat.main(["--schemas", str(released)]) == 0


def _removed(s: dict) -> None:
    del s["properties"]["gpu_busy_ms"]


def _retyped(s: dict) -> None:
    s["properties"]["prompt_tokens"] = {"type": "string"}


def _made_nullable(s: dict) -> None:
    s["properties"]["prompt_tokens"] = {"anyOf": [{"type": "integer"}, {"type": "null"}]}


def _required(s: dict) -> None:
    s["properties"]["region"] = {"type": "string"}
    s["required"].append("region")


def _enum_shrunk(s: dict) -> None:
    s["$defs"]["CostKind"]["enum"].remove("idle")


@pytest.mark.parametrize(
    "change, message",
    [
        (_removed, "CostRecord: gpu_busy_ms: field removed"),
        (_retyped, "CostRecord: prompt_tokens: type changed from integer to string"),
        (_made_nullable, "CostRecord: prompt_tokens: type changed from integer to integer|null"),
        (_required, "CostRecord: region: new required field"),
        (_enum_shrunk, 'CostRecord: kind: enum value(s) removed: "idle"'),
    ],
)
def test_a_breaking_change_fails_with_what_broke(
    released: Path, capsys: pytest.CaptureFixture[str], change, message: str
) -> None:
    schema = message_schema(CostRecord)
    change(schema)
    write_cost_schema(released, schema)
    assert compat.main(["--schemas", str(released)]) == 1
    err = capsys.readouterr().err
    assert message in err and "SCHEMA_VERSION" in err


def test_a_new_version_may_break(released: Path) -> None:
    schema = message_schema(CostRecord)
    _removed(schema)
    schema["x-llmbus-schema-version"] = 2
    write_cost_schema(released, schema)
    assert compat.main(["--schemas", str(released)]) == 0


def test_a_removed_message_fails(released: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (released / "messages" / "Comparison.json").unlink()
    assert compat.main(["--schemas", str(released)]) == 1
    assert "Comparison: message removed from the contract" in capsys.readouterr().err


def test_an_external_validator_with_the_released_schema_accepts_a_newer_record() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    released = json.loads((SCHEMAS / "previous" / "messages" / "CostRecord.json").read_text())
    later = NextCostRecord(request_id="r1", tenant="acme", model="m", cost_usd=0.1, region="eu-west")
    jsonschema.validate(json.loads(later.to_bytes()), released)  # raises if refused
    client = json.loads((SCHEMAS / "previous" / "messages" / "InferenceRequest.json").read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"prompt": "hi", "tempreature": 0}, client)
