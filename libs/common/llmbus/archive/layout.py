"""Where the archive keeps what (pure: names and paths, no file is opened here).

    <root>/<kind>/day=<YYYY-MM-DD>/tenant=<tenant>/<topic>-p<partition>-<first>-<last>.parquet
    <root>/_manifests/<topic>/p<partition>/<first>-<last>.json

A data file is named by the source offsets of the batch it came from (zero-padded, so names sort
as offsets do). A batch's manifest is its commit point: once it exists, every offset in
[first, last] of that topic-partition is archived, and a redelivered record in that range is
skipped. Readers take only `*.parquet` (a file still being written ends in `.tmp`).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from llmbus.settings import cache_root


def default_root() -> Path:
    """`$LLMBUS_CACHE/archive`, read when asked (LLMBUS_ARCHIVE_DIR overrides it; the stacks: a volume)."""
    return cache_root() / "archive"


MANIFESTS = "_manifests"
DATA_SUFFIX = ".parquet"
TMP_SUFFIX = ".tmp"
NO_TENANT = "_none"  # comparisons belong to an experiment, not to one tenant
_OFFSET_DIGITS = 20
_RANGE = re.compile(r"^(\d+)-(\d+)\.json$")
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True, order=True)
class OffsetRange:
    first: int
    last: int

    def __contains__(self, offset: object) -> bool:
        return isinstance(offset, int) and self.first <= offset <= self.last

    def stem(self) -> str:
        return f"{self.first:0{_OFFSET_DIGITS}d}-{self.last:0{_OFFSET_DIGITS}d}"


def safe(value: str) -> str:
    """A path segment from a tenant or topic name (they are already [A-Za-z0-9_.-]; this keeps it so)."""
    return _SAFE.sub("_", value) or NO_TENANT


def partition_dir(kind: str, day: str, tenant: str) -> PurePath:
    return PurePath(kind, f"day={day}", f"tenant={safe(tenant)}")


def data_file(kind: str, day: str, tenant: str, topic: str, partition: int, offsets: OffsetRange) -> PurePath:
    return partition_dir(kind, day, tenant) / f"{safe(topic)}-p{partition}-{offsets.stem()}{DATA_SUFFIX}"


def manifest_dir(topic: str, partition: int) -> PurePath:
    return PurePath(MANIFESTS, safe(topic), f"p{partition}")


def manifest_file(topic: str, partition: int, offsets: OffsetRange) -> PurePath:
    return manifest_dir(topic, partition) / f"{offsets.stem()}.json"


def parse_manifest_name(name: str) -> OffsetRange | None:
    """The offset range a manifest's file name states; None for anything else (a `.tmp`)."""
    match = _RANGE.match(name)
    return OffsetRange(int(match[1]), int(match[2])) if match else None


def covered(offset: int, ranges: list[OffsetRange]) -> bool:
    return any(offset in span for span in ranges)


def day_of(epoch_ms: int) -> str:
    return dt.datetime.fromtimestamp(epoch_ms / 1000, dt.UTC).strftime("%Y-%m-%d")
