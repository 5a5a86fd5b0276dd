"""archive's own wiring (app.build) in memory and on the real broker: results into Parquet by day and tenant,
each record id once however often it comes, a record that does not decode dead-lettered."""

from __future__ import annotations

from pathlib import Path

from llmbus.archive.read import read_rows
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.contract.messages import DeadLetter, InferenceResult, ResultStatus
from llmbus_services.archive.app import build
from llmbus_services.archive.config import ArchiveSettings
from tests.fixtures.buses import EitherBus
from tests.support import eventually


async def test_results_are_archived_once_each_and_a_bad_record_is_dead_lettered(
    on_bus: EitherBus, tmp_path: Path
) -> None:
    topics = on_bus.topics
    results = topics.name(t.RESULTS)
    runtime = await on_bus.runtime(contracts.ARCHIVE)
    build(runtime, ArchiveSettings(dir=tmp_path, prompts=False, fetch_max_wait_ms=100, fetch_min_bytes=1))
    await on_bus.start(runtime)
    for rid in ("r1", "r2", "r1", "r3"):  # r1 delivered again, then r3 behind it in its partition
        result = InferenceResult(request_id=rid, tenant="acme", status=ResultStatus.OK, model="m", text=rid)
        await on_bus.send(results, result, key="k" if rid != "r2" else "r2")
    await on_bus.send(results, b"not json", key="junk")
    [letter] = await on_bus.published(topics.name(t.DLQ), DeadLetter, until=lambda found: len(found) >= 1)
    assert letter.source_topic == results and letter.error_code == "malformed"

    async def archived() -> bool:  # r3 came after r1's second copy in their partition; r2 in its own
        return {"r2", "r3"} <= {row["request_id"] for row in read_rows(tmp_path, "results")}

    await eventually(archived, timeout_s=30)
    rows = read_rows(tmp_path, "results")
    assert sorted(row["request_id"] for row in rows) == ["r1", "r2", "r3"]
    assert {row["tenant"] for row in rows} == {"acme"}
