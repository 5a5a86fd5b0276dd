"""OTel GenAI semantic-convention names in results' and cost records' payloads (llmbus.contract.messages.genai)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from aiokafka.structs import ConsumerRecord

from llmbus.bus.codec import decode
from llmbus.bus.span_attrs import message_attributes
from llmbus.contract import semconv as sc
from llmbus.contract.messages import CostKind, CostRecord, FinishReason, InferenceResult, ResultStatus, Usage

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SEMCONV_NAMES = {value for name, value in vars(sc).items() if name.startswith("GEN_AI_")}


def flatten(node: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Dotted paths to leaves, as pandas' json_normalize or a Flink ROW access name them."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            out |= flatten(value, f"{prefix}.{key}")
        else:
            out[f"{prefix}.{key}"] = value
    return out


def result() -> InferenceResult:
    return InferenceResult(
        request_id="r1",
        tenant="acme",
        status=ResultStatus.OK,
        model="qwen-0.5b",
        finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=120, completion_tokens=16, cached_prompt_tokens=96),
        session_id="s-7",
    )


def cost(kind: CostKind = CostKind.SELF_HOSTED) -> CostRecord:
    return CostRecord(
        request_id="r1",
        record_id="acme:r1",
        tenant="acme",
        model="qwen-0.5b",
        cost_usd=0.000031,
        cost_micro_usd=31,
        kind=kind,
        prompt_tokens=120,
        cached_prompt_tokens=96,
        completion_tokens=16,
        session_id="s-7",
    )


def payload(message: InferenceResult | CostRecord) -> dict[str, Any]:
    return json.loads(message.to_bytes())


def test_a_result_carries_the_convention_names_with_its_own_values() -> None:
    assert flatten(payload(result())["gen_ai"], "gen_ai") == {
        sc.GEN_AI_RESPONSE_MODEL: "qwen-0.5b",
        sc.GEN_AI_RESPONSE_FINISH_REASONS: ["length"],
        sc.GEN_AI_USAGE_INPUT_TOKENS: 120,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 16,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 96,
        sc.GEN_AI_CONVERSATION_ID: "s-7",
    }


def test_a_request_cost_carries_them_and_a_workers_idle_time_does_not() -> None:
    names = flatten(payload(cost())["gen_ai"], "gen_ai")
    assert names == {
        sc.GEN_AI_RESPONSE_MODEL: "qwen-0.5b",
        sc.GEN_AI_USAGE_INPUT_TOKENS: 120,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 16,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 96,
        sc.GEN_AI_CONVERSATION_ID: "s-7",
    }
    assert set(names) <= SEMCONV_NAMES
    for kind in (CostKind.IDLE, CostKind.COLD_START_WASTE):
        assert "gen_ai" not in payload(cost(kind))


def test_absent_facts_are_left_out_not_written_as_null() -> None:
    refused = InferenceResult(request_id="r2", tenant="acme", status=ResultStatus.ERROR)
    assert flatten(payload(refused)["gen_ai"], "gen_ai") == {
        sc.GEN_AI_USAGE_INPUT_TOKENS: 0,
        sc.GEN_AI_USAGE_OUTPUT_TOKENS: 0,
        sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: 0,
    }


def test_the_object_follows_the_fields_it_is_derived_from() -> None:
    changed = result().model_copy(update={"usage": Usage(prompt_tokens=7, completion_tokens=1), "model": "m2"})
    names = flatten(payload(changed)["gen_ai"], "gen_ai")
    assert (names[sc.GEN_AI_USAGE_INPUT_TOKENS], names[sc.GEN_AI_RESPONSE_MODEL]) == (7, "m2")


def test_reading_a_record_back_keeps_the_fields_as_the_truth() -> None:
    original = result()
    read = decode(ConsumerRecord("llm.results", 0, 1, 0, 0, None, original.to_bytes(), None, 0, 0, []), InferenceResult)
    assert read == original  # the derived object is not kept: equal to what was written
    tampered = payload(original)
    tampered["gen_ai"]["usage"]["input_tokens"] = 1
    reread = InferenceResult.model_validate(tampered)
    assert payload(reread)["gen_ai"]["usage"]["input_tokens"] == 120


def test_the_payloads_validate_against_the_generated_schemas() -> None:
    for message in (result(), cost()):
        schema = json.loads((SCHEMAS / "messages" / f"{type(message).__name__}.json").read_text())
        jsonschema.validate(payload(message), schema)
        assert "gen_ai" in schema["properties"]


def test_include_and_exclude_are_honoured() -> None:
    assert result().model_dump(include={"request_id"}) == {"request_id": "r1"}
    assert "gen_ai" not in result().model_dump(exclude={"gen_ai"})


def test_a_results_span_and_its_payload_use_the_same_names_and_values() -> None:
    attributes = message_attributes(result())
    payload_names = flatten(payload(result())["gen_ai"], "gen_ai")
    assert {name: attributes[name] for name in payload_names} == payload_names


# The wire bytes written by the wrap-serializer version (captured from it), timestamps pinned: the
# computed field must write exactly these.
WIRE_BEFORE = {
    "result": '{"schema_version":1,"request_id":"r1","tenant":"acme","status":"ok","model":"qwen-0.5b","text":"",'
    '"finish_reason":"length","usage":{"prompt_tokens":120,"completion_tokens":16,"cached_prompt_tokens":96},'
    '"timings":{},"cached":false,"shadow":false,"trimmed_tokens":0,"attempt":1,"produced_by":"",'
    '"completed_at_ms":1,"preemptions":0,"session_id":"s-7","gen_ai":{"response":{"model":"qwen-0.5b",'
    '"finish_reasons":["length"]},"usage":{"input_tokens":120,"output_tokens":16,"cache_read":{"input_tokens":96}},'
    '"conversation":{"id":"s-7"}}}',
    "cost": '{"schema_version":1,"request_id":"r1","tenant":"acme","model":"qwen-0.5b","cost_usd":0.000031,'
    '"cached_saving_usd":0.0,"record_id":"acme:r1","kind":"self_hosted","booked_to":"tenant","cost_micro_usd":31,'
    '"cold_start_micro_usd":0,"cold_start_phases_s":{},"saving_micro_usd":0,"output_cap_saving_micro_usd":0,'
    '"shadow":false,"session_id":"s-7","prompt_tokens":120,"cached_prompt_tokens":96,"completion_tokens":16,'
    '"trimmed_prompt_tokens":0,"gpu_busy_ms":0.0,"booked_at_ms":1,"gen_ai":{"response":{"model":"qwen-0.5b"},'
    '"usage":{"input_tokens":120,"output_tokens":16,"cache_read":{"input_tokens":96}},"conversation":{"id":"s-7"}}}',
    "error": '{"schema_version":1,"request_id":"r2","tenant":"t","status":"ok","text":"","usage":{"prompt_tokens":0,'
    '"completion_tokens":0,"cached_prompt_tokens":0},"timings":{},"cached":false,"shadow":false,"trimmed_tokens":0,'
    '"attempt":1,"produced_by":"","completed_at_ms":1,"preemptions":0,"gen_ai":{"usage":{"input_tokens":0,'
    '"output_tokens":0,"cache_read":{"input_tokens":0}}}}',
}


def test_the_wire_bytes_are_the_ones_written_before() -> None:
    pinned = {
        "result": result().model_copy(update={"completed_at_ms": 1}),
        "cost": cost().model_copy(update={"booked_at_ms": 1}),
        "error": InferenceResult(request_id="r2", tenant="t", status=ResultStatus.OK, completed_at_ms=1),
    }
    assert {name: message.to_bytes().decode() for name, message in pinned.items()} == WIRE_BEFORE
    # Without exclude_none a record with no attribute writes `"gen_ai": null`, as before (now the last key).
    idle = json.loads(cost(CostKind.IDLE).model_dump_json())
    assert list(idle)[-1] == "gen_ai" and idle["gen_ai"] is None


def test_a_record_built_with_a_gen_ai_object_drops_it() -> None:
    given = InferenceResult.model_validate({**payload(result()), "gen_ai": {"usage": {"input_tokens": 1}}})
    assert given.gen_ai_read is None
    assert payload(given)["gen_ai"]["usage"]["input_tokens"] == 120
