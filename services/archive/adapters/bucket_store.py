"""The archive in an S3-compatible bucket: the directory's layout as object keys under `s3://<bucket>/<prefix>/`.

    <prefix><kind>/day=<YYYY-MM-DD>/tenant=<tenant>/<topic>-p<partition>-<first>-<last>.parquet
    <prefix>_manifests/<topic>/p<partition>/<first>-<last>.json

A batch is written with the directory's protocol, objects in place of files:
  1. every data object as `<key>.tmp`;
  2. the batch's manifest object: the commit point — from here the batch is archived;
  3. each data object copied (server-side) to its key, its `.tmp` deleted.
An object is whole or absent once its PUT returns, so there is nothing to fsync. A crash between 2 and 3
is finished at the next start from the manifests; a `.tmp` no manifest names and older than the orphan
age is removed then. Readers take only `*.parquet` keys. A failing store raises ObjectStoreError (an
OSError): the handler holds the batch, uncommitted, and retries it.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import PurePath, PurePosixPath

import pyarrow.parquet as pq

from llmbus.archive.layout import DATA_SUFFIX, MANIFESTS, TMP_SUFFIX, OffsetRange, manifest_dir, manifest_file
from llmbus.archive.layout import parse_manifest_name as parse_range
from llmbus.archive.rows import table_of
from llmbus.artifacts.location import parse_location
from llmbus.artifacts.store import ObjectStore
from llmbus_services.archive.adapters.record_ids import RecordIds
from llmbus_services.archive.core.plan import BatchPlan, manifest_body


class BucketArchiveStore:
    def __init__(self, store: ObjectStore, uri: str, *, id_cache_dirs: int = 256, compression: str = "zstd") -> None:
        location = parse_location(uri)
        if location.scheme != "s3":
            raise ValueError(f"LLMBUS_ARCHIVE_S3_URI {uri!r}: expected s3://<bucket>/<prefix>/")
        self.store, self.bucket, self.prefix = store, location.bucket, location.root
        self.uri = location.uri
        self.compression = compression
        self._ids = RecordIds(self._read_ids, id_cache_dirs)
        store.ensure_bucket(self.bucket)

    def recover(self, orphan_age_s: float) -> tuple[int, int]:
        """At start: copy the manifested `.tmp` objects a crash left to their keys; remove `.tmp` objects no
        manifest names, older than `orphan_age_s`. Returns (objects completed, orphans removed)."""
        objects = {info.key: info for info in self.store.objects(self.bucket, self.prefix)}
        named: set[str] = set()
        completed = 0
        for key in sorted(k for k in objects if k.startswith(self._key(MANIFESTS)) and k.endswith(".json")):
            for name in json.loads(self.store.get_bytes(self.bucket, key))["files"]:
                final = self._key(name)
                named.add(final)
                if final not in objects and final + TMP_SUFFIX in objects:
                    self.store.copy(self.bucket, final + TMP_SUFFIX, final)
                    completed += 1
        cutoff = time.time() - orphan_age_s
        doomed = [
            key
            for key, info in objects.items()
            if key.endswith(TMP_SUFFIX) and (key.removesuffix(TMP_SUFFIX) in named or info.modified_s < cutoff)
        ]  # a named one is copied by now; an unnamed old one belongs to a batch that never committed
        self.store.delete(self.bucket, doomed)
        return completed, len([key for key in doomed if key.removesuffix(TMP_SUFFIX) not in named])

    def archived_ranges(self, topic: str, partition: int) -> list[OffsetRange]:
        """The offset ranges of this topic-partition's manifests, listed from the bucket each time."""
        directory = self._key(str(manifest_dir(topic, partition))) + "/"
        names = (PurePosixPath(info.key).name for info in self.store.objects(self.bucket, directory))
        return [span for name in names if (span := parse_range(name)) is not None]

    def known_ids(self, directory: PurePath) -> set[str]:
        return self._ids.of(directory)

    def write(self, plan: BatchPlan) -> None:
        """Write a planned batch (blocking: run it in a thread)."""
        assert plan.offsets is not None
        for path, rows in plan.files.items():
            buffer = io.BytesIO()
            pq.write_table(table_of(rows), buffer, compression=self.compression)
            self.store.put_bytes(self.bucket, self._key(str(path)) + TMP_SUFFIX, buffer.getvalue())
        manifest = self._key(str(manifest_file(plan.topic, plan.partition, plan.offsets)))
        body = json.dumps(manifest_body(plan, int(time.time() * 1000))).encode()
        self.store.put_bytes(self.bucket, manifest, body, content_type="application/json")  # the commit point
        for path in plan.files:
            self.store.copy(self.bucket, self._key(str(path)) + TMP_SUFFIX, self._key(str(path)))
        self.store.delete(self.bucket, [self._key(str(path)) + TMP_SUFFIX for path in plan.files])
        self._ids.learn(plan.ids_by_dir())

    def _read_ids(self, directory: PurePath) -> set[str]:
        ids: set[str] = set()
        for info in self.store.objects(self.bucket, self._key(str(directory)) + "/"):
            if info.key.endswith(DATA_SUFFIX):
                data = self.store.get_bytes(self.bucket, info.key)
                ids.update(pq.read_table(io.BytesIO(data), columns=["record_id"]).column("record_id").to_pylist())
        return ids

    def _key(self, path: str) -> str:
        return f"{self.prefix}{path}"
