"""The archive directory: Parquet files written so a batch is in it whole or not at all.

A batch is written in three steps, and its offsets are committed only after the last:
  1. every data file as `<name>.parquet.tmp` (flushed to disk);
  2. the batch's manifest (its offset range and its files), written as `.tmp` and renamed: the
     commit point — from here the batch is archived;
  3. each data file renamed to its name.
A SIGKILL before 2 leaves `.tmp` files no reader takes (removed at the next start); after 2 the
next start completes step 3 from the manifest, and the redelivered records are inside its range.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path, PurePath

import pyarrow.parquet as pq

from llmbus.archive.compact import CompactionBusy, compaction_lock, finish_compactions, journaled_outputs
from llmbus.archive.durable import commit_durably, fsync_dir
from llmbus.archive.durable import tmp_path as _tmp
from llmbus.archive.layout import DATA_SUFFIX, MANIFESTS, TMP_SUFFIX, OffsetRange, manifest_dir, manifest_file
from llmbus.archive.layout import parse_manifest_name as parse_range
from llmbus.archive.rows import table_of
from llmbus_services.archive.adapters.record_ids import RecordIds
from llmbus_services.archive.core.plan import BatchPlan, manifest_body

log = logging.getLogger(__name__)


class ArchiveStore:
    def __init__(self, root: Path, *, id_cache_dirs: int = 256, compression: str = "zstd") -> None:
        self.root = root
        self.compression = compression
        self._ids = RecordIds(self._read_ids, id_cache_dirs)

    def recover(self, orphan_age_s: float) -> tuple[int, int]:
        """At start: finish the compactions and the renames of every manifested batch a crash stopped;
        remove `.tmp` files older than `orphan_age_s` that no manifest or compaction journal names (a
        batch or a compaction killed before its commit point).
        Returns (files completed, orphans removed)."""
        completed = removed = 0
        try:
            with compaction_lock(self.root):
                finish_compactions(self.root)  # a compaction a crash stopped past its commit point
        except CompactionBusy:
            log.info("a compaction is running: it finishes what it started")
        named: set[Path] = journaled_outputs(self.root)
        for manifest in sorted((self.root / MANIFESTS).glob("*/*/*.json")):
            for name in json.loads(manifest.read_text())["files"]:
                final = self.root / name
                named.add(final)
                if not final.exists() and _tmp(final).exists():
                    os.replace(_tmp(final), final)
                    completed += 1
        cutoff = time.time() - orphan_age_s
        for tmp in self.root.glob(f"**/*{TMP_SUFFIX}"):
            if tmp.with_name(tmp.name.removesuffix(TMP_SUFFIX)) not in named and tmp.stat().st_mtime < cutoff:
                tmp.unlink(missing_ok=True)
                removed += 1
        return completed, removed

    def archived_ranges(self, topic: str, partition: int) -> list[OffsetRange]:
        """The offset ranges of this topic-partition's manifests, read from the directory each time
        (another instance of the archive may have written some since this one last held it)."""
        directory = self.root / manifest_dir(topic, partition)
        if not directory.is_dir():
            return []
        return [span for name in os.listdir(directory) if (span := parse_range(name)) is not None]

    def known_ids(self, directory: PurePath) -> set[str]:
        """The record ids already in a day/tenant directory (read once, then kept; least recent forgotten)."""
        return self._ids.of(directory)

    def _read_ids(self, directory: PurePath) -> set[str]:
        ids: set[str] = set()
        for path in (self.root / directory).glob(f"*{DATA_SUFFIX}"):
            ids.update(pq.read_table(path, columns=["record_id"]).column("record_id").to_pylist())
        return ids

    def write(self, plan: BatchPlan) -> None:
        """Write a planned batch (blocking: run it in a thread). The id caches learn its ids only once
        the manifest is in place, so a batch that failed leaves nothing behind that would hide its rows."""
        assert plan.offsets is not None
        for path, rows in plan.files.items():
            final = self.root / path
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(_tmp(final), "wb") as handle:
                pq.write_table(table_of(rows), handle, compression=self.compression)
                handle.flush()
                os.fsync(handle.fileno())
        manifest = self.root / manifest_file(plan.topic, plan.partition, plan.offsets)
        manifest.parent.mkdir(parents=True, exist_ok=True)
        body = manifest_body(plan, int(time.time() * 1000))
        commit_durably(manifest, json.dumps(body).encode())  # the commit point
        for path in plan.files:
            final = self.root / path
            os.replace(_tmp(final), final)
        for directory in {(self.root / path).parent for path in plan.files}:
            fsync_dir(directory)
        self._ids.learn(plan.ids_by_dir())
