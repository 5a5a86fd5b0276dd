"""Compaction: a day/tenant directory's small files merged into one, each record id once, crash-safe.

A quiet topic gives the archive many small files (one per batch). `llmbus archive compact` merges
each closed day's directory (a day before today, UTC) into one file, one directory at a time:
  1. the merged rows (each record id once: the first by source offset) written as
     `compacted-<id>.parquet.tmp`, fsynced;
  2. a journal `_compactions/<id>.json` naming the output and its inputs, committed durably: from
     here the compaction is finished by whoever looks next;
  3. the output renamed to its name;
  4. every input removed, the directory fsynced;
  5. the journal removed.
A crash before 2 leaves a `.tmp` that no reader takes (the archive removes it at its next start).
After 2, `finish_compactions` — run by the next compaction and by the archive at its start —
completes 3 to 5. Inputs are removed only once the output is in place, so no record is ever
missing; between 3 and 4 a record is in the output and in an input, so a reader that dedupes by
record id (llmbus.archive.read does) sees it once, and one that does not sees it twice until the
compaction is finished. One compaction runs at a time (a lock file); the archive service may keep
writing: a file written into a directory after its inputs were listed is left as it is.
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePath

import pyarrow as pa
import pyarrow.parquet as pq

from llmbus.archive.durable import commit_durably, fsync_dir, tmp_path
from llmbus.archive.layout import DATA_SUFFIX
from llmbus.archive.rows import SCHEMA

COMPACTIONS = "_compactions"
OUTPUT_PREFIX = "compacted-"
_LOCK = ".lock"


class CompactionBusy(RuntimeError):
    """Another compaction holds the archive's compaction lock."""


@dataclass(frozen=True)
class Compacted:
    directory: PurePath
    files_in: int
    rows_in: int
    rows_out: int


def closed_directories(root: Path, before_day: str, min_files: int = 2) -> list[PurePath]:
    """The `<kind>/day=<d>/tenant=<t>` directories of days before `before_day` with `min_files` files or more."""
    found: list[PurePath] = []
    for directory in sorted(root.glob("*/day=*/tenant=*")):
        kind, day = directory.parent.parent.name, directory.parent.name.removeprefix("day=")
        if kind.startswith("_") or day >= before_day:
            continue
        if len(list(directory.glob(f"*{DATA_SUFFIX}"))) >= min_files:
            found.append(directory.relative_to(root))
    return found


def merged(tables: list[pa.Table]) -> pa.Table:
    """The rows of `tables`, each record id once (the first by topic, partition, offset), in that order."""
    table = pa.concat_tables(tables).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    ids = table.column("record_id").to_pylist()
    seen: set[str] = set()
    first = [not (rid in seen or seen.add(rid)) for rid in ids]  # type: ignore[func-returns-value]
    return table.filter(pa.array(first, pa.bool_()))


@contextmanager
def compaction_lock(root: Path, *, wait: bool = False) -> Iterator[None]:
    """Held while a compaction runs or is finished; CompactionBusy when another holds it and not `wait`."""
    directory = root / COMPACTIONS
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / _LOCK, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CompactionBusy(f"another compaction of {root} is running") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _journals(root: Path) -> list[Path]:
    return sorted((root / COMPACTIONS).glob("*.json"))


def journaled_outputs(root: Path) -> set[Path]:
    """The outputs (final paths) of compactions past their commit point and not yet finished."""
    return {root / json.loads(journal.read_text())["output"] for journal in _journals(root)}


def _finish(root: Path, journal: Path) -> None:
    entry = json.loads(journal.read_text())
    output = root / entry["output"]
    if tmp_path(output).exists():
        os.replace(tmp_path(output), output)
    if output.exists():  # never remove an input before the output is in place
        for name in entry["inputs"]:
            (root / name).unlink(missing_ok=True)
        fsync_dir(output.parent)
    journal.unlink()
    fsync_dir(journal.parent)


def finish_compactions(root: Path) -> int:
    """Complete every compaction past its commit point (a crash stopped it); the caller holds the lock."""
    journals = _journals(root)
    for journal in journals:
        _finish(root, journal)
    return len(journals)


def compact_directory(root: Path, directory: PurePath, compression: str = "zstd") -> Compacted:
    """Merge the data files of one directory into one (the protocol above); the caller holds the lock."""
    inputs = sorted((root / directory).glob(f"*{DATA_SUFFIX}"))
    tables = [pq.read_table(path, schema=SCHEMA) for path in inputs]
    rows_in = sum(table.num_rows for table in tables)
    table = merged(tables)
    compaction_id = uuid.uuid4().hex[:16]
    output = root / directory / f"{OUTPUT_PREFIX}{compaction_id}{DATA_SUFFIX}"
    with open(tmp_path(output), "wb") as handle:
        pq.write_table(table, handle, compression=compression)
        handle.flush()
        os.fsync(handle.fileno())
    entry = {
        "directory": str(directory),
        "output": str(output.relative_to(root)),
        "inputs": [str(path.relative_to(root)) for path in inputs],
        "rows_in": rows_in,
        "rows_out": table.num_rows,
    }
    journal = root / COMPACTIONS / f"{compaction_id}.json"
    commit_durably(journal, json.dumps(entry).encode())  # the commit point
    _finish(root, journal)
    return Compacted(directory, len(inputs), rows_in, table.num_rows)


def compact(root: Path, before_day: str, *, min_files: int = 2, compression: str = "zstd") -> list[Compacted]:
    """Finish what a crash left, then compact every closed directory with `min_files` files or more."""
    with compaction_lock(root):
        finish_compactions(root)
        return [
            compact_directory(root, directory, compression)
            for directory in closed_directories(root, before_day, min_files)
        ]
