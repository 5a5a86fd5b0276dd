"""The archive's pure plan and its directory store: once per offset and per record id, whole batches only."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePath

import pyarrow.parquet as pq

from llmbus.archive import read
from llmbus.archive.layout import OffsetRange, covered, parse_manifest_name
from llmbus.archive.rows import KINDS_BY_NAME, SCHEMA, Source, row_of
from llmbus.contract.messages import Feedback, InferenceResult, ResultStatus
from llmbus_services.archive.adapters.store import ArchiveStore
from llmbus_services.archive.core.plan import plan_batch

DAY_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z


def result(request_id: str, tenant: str = "acme", at_ms: int = DAY_MS) -> InferenceResult:
    return InferenceResult(
        request_id=request_id, tenant=tenant, status=ResultStatus.OK, text=f"answer {request_id}", completed_at_ms=at_ms
    )


def result_rows(ids: list[str], first_offset: int = 0, topic: str = "llm.results") -> list[dict]:
    kind = KINDS_BY_NAME["results"]
    return [row_of(kind, result(i), Source(topic, 0, first_offset + n, DAY_MS)) for n, i in enumerate(ids)]


def no_ids(_directory: PurePath) -> set[str]:
    return set()


def test_offset_ranges_name_and_cover() -> None:
    span = OffsetRange(5, 9)
    assert parse_manifest_name(f"{span.stem()}.json") == span
    assert parse_manifest_name(f"{span.stem()}.json.tmp") is None
    assert covered(5, [span]) and covered(9, [span]) and not covered(10, [span]) and not covered(4, [span])


def test_plan_skips_what_a_manifest_covers_and_ids_already_archived() -> None:
    rows = result_rows(["a", "b", "c", "d"], first_offset=10)
    known = {PurePath("results/day=2025-12-01/tenant=acme"): {"acme/c"}}
    plan = plan_batch("llm.results", 0, rows, [10, 11, 12, 13], [OffsetRange(0, 10)], lambda d: known.get(d, set()))
    assert plan.offsets == OffsetRange(11, 13)
    assert plan.redelivered == 1 and plan.duplicates == 1
    [(path, written)] = plan.files.items()
    assert (
        str(path)
        == "results/day=2025-12-01/tenant=acme/llm.results-p0-00000000000000000011-00000000000000000013.parquet"
    )
    assert [row["record_id"] for row in written] == ["acme/b", "acme/d"]


def test_plan_dedupes_inside_a_batch_and_splits_by_day_and_tenant() -> None:
    kind = KINDS_BY_NAME["results"]
    messages = [result("a"), result("a"), result("b", tenant="globex"), result("c", at_ms=DAY_MS + 86_400_000)]
    rows = [row_of(kind, m, Source("llm.results", 1, n, DAY_MS)) for n, m in enumerate(messages)]
    plan = plan_batch("llm.results", 1, rows, [0, 1, 2, 3], [], no_ids)
    assert plan.duplicates == 1
    assert sorted(str(p.parent) for p in plan.files) == [
        "results/day=2025-12-01/tenant=acme",
        "results/day=2025-12-01/tenant=globex",
        "results/day=2025-12-02/tenant=acme",
    ]


def test_plan_of_a_batch_wholly_archived_writes_nothing() -> None:
    plan = plan_batch("llm.results", 0, result_rows(["a"]), [0], [OffsetRange(0, 5)], no_ids)
    assert plan.offsets is None and not plan.files and plan.redelivered == 1


def test_feedback_id_is_its_body() -> None:
    kind = KINDS_BY_NAME["feedback"]
    same = [row_of(kind, Feedback(request_id="r", tenant="acme", score=1.0), Source("f", 0, n, DAY_MS)) for n in (0, 1)]
    other = row_of(kind, Feedback(request_id="r", tenant="acme", score=0.0), Source("f", 0, 2, DAY_MS))
    assert same[0]["record_id"] == same[1]["record_id"] != other["record_id"]


def test_store_writes_a_batch_once_and_remembers_its_ids(tmp_path: Path) -> None:
    store = ArchiveStore(tmp_path)
    plan = plan_batch("llm.results", 0, result_rows(["a", "b"]), [0, 1], [], store.known_ids)
    store.write(plan)
    assert store.archived_ranges("llm.results", 0) == [OffsetRange(0, 1)]
    table = read.read_table(tmp_path, "results")
    assert table.schema == SCHEMA and sorted(table.column("record_id").to_pylist()) == ["acme/a", "acme/b"]
    # The same records again at later offsets (a producer's resend): known ids, nothing written.
    again = plan_batch("llm.results", 0, result_rows(["a", "b"], 2), [2, 3], [], store.known_ids)
    assert again.duplicates == 2 and not again.files
    # A fresh store (a restart) reads the ids back from the files.
    fresh = ArchiveStore(tmp_path)
    assert fresh.known_ids(PurePath("results/day=2025-12-01/tenant=acme")) == {"acme/a", "acme/b"}


def test_recover_finishes_a_manifested_batch_and_drops_an_unmanifested_one(tmp_path: Path) -> None:
    store = ArchiveStore(tmp_path)
    done = plan_batch("llm.results", 0, result_rows(["a"]), [0], [], no_ids)
    store.write(done)
    [path] = done.files
    final = tmp_path / path
    os.replace(final, final.with_name(final.name + ".tmp"))  # as if killed after the manifest, before the rename
    orphan = (
        tmp_path
        / "results/day=2025-12-01/tenant=acme/llm.results-p0-00000000000000000001-00000000000000000001.parquet.tmp"
    )
    orphan.write_bytes(b"half a file")  # as if killed before the manifest
    assert read.data_files(tmp_path, "results") == []
    assert store.recover(orphan_age_s=0) == (1, 1)
    assert final.exists() and not orphan.exists()
    assert pq.read_table(final).column("record_id").to_pylist() == ["acme/a"]
    manifest = json.loads(next((tmp_path / "_manifests").rglob("*.json")).read_text())
    assert manifest["files"] == [str(path)] and manifest["rows"] == 1


def test_reader_takes_each_record_id_once(tmp_path: Path) -> None:
    store = ArchiveStore(tmp_path)
    store.write(plan_batch("llm.results", 0, result_rows(["a"]), [0], [], no_ids))
    store.write(
        plan_batch("llm.results", 1, result_rows(["a"], topic="llm.results"), [0], [], no_ids)
    )  # copied in by hand
    rows = read.read_rows(tmp_path, "results")
    assert [row["record_id"] for row in rows] == ["acme/a"] and rows[0]["message"]["text"] == "answer a"
