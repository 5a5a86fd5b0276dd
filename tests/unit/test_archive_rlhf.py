"""`llmbus export rlhf` on an archive written by the archive's store: the join, the filters, the schema."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmbus.archive.rows import KINDS_BY_NAME, Source, row_of
from llmbus.cli.main import app
from llmbus.contract.messages import (
    ChatMessage,
    CostRecord,
    ErrorCode,
    ErrorInfo,
    Feedback,
    InferenceRequest,
    InferenceResult,
    Message,
    ResultStatus,
    Usage,
)
from llmbus.contract.schemagen import rlhf_schema
from llmbus_services.archive.adapters.store import ArchiveStore
from llmbus_services.archive.core.plan import plan_batch

REPO = Path(__file__).resolve().parents[2]
T0 = 1_764_547_200_000  # 2025-12-01T00:00:00Z
HOUR_MS = 3_600_000


def archive(root: Path, kind: str, messages: list[Message], at_ms: int = T0) -> None:
    store = ArchiveStore(root)
    rows = [row_of(KINDS_BY_NAME[kind], m, Source(f"llm.{kind}", 0, n, at_ms)) for n, m in enumerate(messages)]
    store.write(plan_batch(f"llm.{kind}", 0, rows, list(range(len(rows))), [], store.known_ids))


def answer(request_id: str, tenant: str = "acme", **more: object) -> InferenceResult:
    fields: dict = dict(
        request_id=request_id,
        tenant=tenant,
        status=ResultStatus.OK,
        text=f"answer to {request_id}",
        model="m-small",
        model_version="rev-7",
        usage=Usage(prompt_tokens=5, completion_tokens=3),
        completed_at_ms=T0 + HOUR_MS,
    )
    return InferenceResult(**(fields | more))


@pytest.fixture
def archive_dir(tmp_path: Path) -> Path:
    root = tmp_path / "archive"
    archive(
        root,
        "requests",
        [
            InferenceRequest(request_id="r1", tenant="acme", messages=[ChatMessage(role="user", content="hi?")]),
            InferenceRequest(request_id="r2", tenant="acme", prompt="complete me"),
        ],
    )
    archive(
        root,
        "results",
        [
            answer("r1", experiment_id="exp", variant="b", session_id="s1", category="chat"),
            answer("r2"),  # no feedback: only with --unlabelled
            answer("r1.shadow.exp", shadow=True),  # nobody saw it
            answer("r3", status=ResultStatus.ERROR, error=ErrorInfo(code=ErrorCode.INTERNAL, message="x"), text=""),
            answer("r4", tenant="globex"),
            answer("old", completed_at_ms=T0 - 3 * 86_400_000),
        ],
    )
    archive(
        root,
        "feedback",
        [
            Feedback(request_id="r1", tenant="acme", score=0.0),
            Feedback(request_id="r1", tenant="acme", score=1.0, comment="better"),
            Feedback(request_id="r3", tenant="acme", score=0.0),
            Feedback(request_id="r4", tenant="globex", score=1.0),
            Feedback(request_id="old", tenant="acme", score=1.0),
        ],
        at_ms=T0 + 2 * HOUR_MS,
    )
    archive(
        root,
        "costs",
        [CostRecord(request_id="r1", record_id="r1", tenant="acme", model="m-small", cost_usd=0.0, cost_micro_usd=42)],
    )
    return root


def export(archive_dir: Path, out: Path, *args: str) -> list[dict]:
    runner = CliRunner()
    outcome = runner.invoke(
        app, ["export", "rlhf", "--archive", str(archive_dir), "--since", "2025-12-01", "--out", str(out), *args]
    )
    assert outcome.exit_code == 0, outcome.output
    if out.suffix == ".parquet":
        return pq.read_table(out).to_pylist()
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_a_labelled_answer_is_joined_with_its_prompt_cost_and_every_feedback(archive_dir: Path, tmp_path: Path) -> None:
    [record] = export(archive_dir, tmp_path / "out.jsonl", "--tenant", "acme")
    assert record["request_id"] == "r1" and record["tenant"] == "acme"
    assert record["prompt_messages"] == [
        {"role": "user", "content": "hi?", "name": None, "tool_calls": None, "tool_call_id": None}
    ]
    assert record["response_text"] == "answer to r1"
    assert (record["model"], record["model_version"], record["experiment_id"], record["variant"]) == (
        "m-small",
        "rev-7",
        "exp",
        "b",
    )
    assert (record["session_id"], record["category"], record["cost_micro_usd"]) == ("s1", "chat", 42)
    assert [f["score"] for f in record["feedback"]] == [0.0, 1.0] and record["score"] == 1.0
    assert record["feedback"][1]["comment"] == "better"


def test_filters_tenant_since_shadow_errors_and_labels(archive_dir: Path, tmp_path: Path) -> None:
    every = export(archive_dir, tmp_path / "all.jsonl", "--unlabelled")
    assert sorted(r["request_id"] for r in every) == ["r1", "r2", "r4"]
    r2 = next(r for r in every if r["request_id"] == "r2")
    assert r2["prompt_text"] == "complete me" and r2["feedback"] == [] and r2["score"] is None
    assert r2["cost_micro_usd"] is None  # no cost record archived for it


def test_every_record_follows_the_committed_schema(archive_dir: Path, tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    committed = json.loads((REPO / "schemas/exports/RlhfRecord.json").read_text())
    assert committed == json.loads(json.dumps(rlhf_schema()))  # `make schemas` wrote it from the model
    records = export(archive_dir, tmp_path / "all.jsonl", "--unlabelled")
    assert records
    for record in records:
        jsonschema.validate(record, committed)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(records[0] | {"unknown": 1}, committed)


def test_parquet_output_holds_the_same_records(archive_dir: Path, tmp_path: Path) -> None:
    as_json = export(archive_dir, tmp_path / "out.jsonl", "--unlabelled")
    as_parquet = export(archive_dir, tmp_path / "out.parquet", "--unlabelled")
    assert [r["request_id"] for r in as_parquet] == [r["request_id"] for r in as_json]
    assert [r["score"] for r in as_parquet] == [r["score"] for r in as_json]
