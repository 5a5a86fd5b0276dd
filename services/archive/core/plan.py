"""Plan one topic-partition's part of a batch (pure): what is new, what is already archived, where rows go.

Two checks make a record archived once however often it is delivered:
  - by offset: a record inside a range some manifest already names was archived by an earlier
    batch (a SIGKILL after the manifest, before the commit, delivers it again): skipped;
  - by record id: a record whose id is already in its day/tenant directory (an upstream service
    published it twice) is a duplicate: counted, not written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from llmbus.archive.layout import OffsetRange, covered, data_file, partition_dir


@dataclass
class BatchPlan:
    topic: str
    partition: int
    offsets: OffsetRange | None  # None: every record was archived already (nothing to write)
    files: dict[PurePath, list[dict[str, Any]]] = field(default_factory=dict)
    redelivered: int = 0  # inside a manifest's range: archived by an earlier batch
    duplicates: int = 0  # a record id already in the archive (or twice in this batch)

    def rows(self) -> int:
        return sum(len(rows) for rows in self.files.values())

    def ids_by_dir(self) -> dict[PurePath, set[str]]:
        return {path.parent: {row["record_id"] for row in rows} for path, rows in self.files.items()}


def plan_batch(
    topic: str,
    partition: int,
    rows: list[dict[str, Any]],
    offsets: list[int],
    archived: list[OffsetRange],
    known_ids: Callable[[PurePath], set[str]],
) -> BatchPlan:
    """`rows` are the decodable records of one topic-partition, `offsets` every record's offset in the
    batch (a record that did not decode is dead-lettered, and its offset still counts as handled)."""
    fresh = [offset for offset in offsets if not covered(offset, archived)]
    plan = BatchPlan(topic, partition, OffsetRange(min(fresh), max(fresh)) if fresh else None)
    plan.redelivered = len(offsets) - len(fresh)
    if plan.offsets is None:
        return plan
    in_batch: dict[PurePath, set[str]] = {}
    for row in rows:
        if covered(row["offset"], archived):
            continue
        directory = partition_dir(row["kind"], row["day"], row["tenant"])
        seen = in_batch.setdefault(directory, set())
        if row["record_id"] in seen or row["record_id"] in known_ids(directory):
            plan.duplicates += 1
            continue
        seen.add(row["record_id"])
        path = data_file(row["kind"], row["day"], row["tenant"], topic, partition, plan.offsets)
        plan.files.setdefault(path, []).append(row)
    return plan


def manifest_body(plan: BatchPlan, written_at_ms: int) -> dict[str, Any]:
    """A batch's manifest: its offset range and its files (the commit point of every archive target)."""
    assert plan.offsets is not None
    return {
        "topic": plan.topic,
        "partition": plan.partition,
        "first_offset": plan.offsets.first,
        "last_offset": plan.offsets.last,
        "files": sorted(str(path) for path in plan.files),
        "rows": plan.rows(),
        "duplicates": plan.duplicates,
        "written_at_ms": written_at_ms,
    }
