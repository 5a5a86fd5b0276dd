"""The archive's bucket target on the real broker and the real object store.

- The archive service writes results (each published twice, as a resend), costs and feedback to a
  bucket and to its directory at once: both hold each record id once, the same rows; with
  LLMBUS_ARCHIVE_LOCAL=false it writes the bucket alone.
- The bucket's commit protocol on the real store: a batch stopped after its manifest (the crash
  between commit point and copy) is completed at the next start; an uncommitted `.tmp` is removed.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from llmbus.archive import read
from llmbus.archive.layout import DATA_SUFFIX, TMP_SUFFIX
from llmbus.archive.rows import KINDS_BY_NAME, Source, row_of
from llmbus.artifacts import ObjectStore, ObjectStoreError
from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.contract import topics as t
from llmbus.contract.messages import CostRecord, Feedback, InferenceResult, ResultStatus
from llmbus_services.archive.adapters.bucket_store import BucketArchiveStore
from llmbus_services.archive.core.plan import plan_batch
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings

pytestmark = [pytest.mark.kafka, pytest.mark.objectstore, pytest.mark.slow]
RESULTS, COSTS, FEEDBACK = 300, 120, 60
TENANTS = ("acme", "globex")


def bucket_ids(store: ObjectStore, bucket: str, prefix: str) -> dict[str, Counter[str]]:
    """Record ids per kind in the bucket's data objects, read raw (no dedupe): what a plain reader sees."""
    found: dict[str, Counter[str]] = {}
    for info in store.objects(bucket, prefix):
        if info.key.endswith(DATA_SUFFIX):
            kind = info.key.removeprefix(prefix).split("/", 1)[0]
            table = pq.read_table(io.BytesIO(store.get_bytes(bucket, info.key)), columns=["record_id"])
            found.setdefault(kind, Counter()).update(table.column("record_id").to_pylist())
    return found


def expected() -> dict[str, set[str]]:
    return {
        "results": {f"{TENANTS[n % 2]}/r{n}" for n in range(RESULTS)},
        "costs": {f"{TENANTS[n % 2]}/r{n}" for n in range(COSTS)},
    }


async def publish_workload(settings) -> None:  # type: ignore[no-untyped-def]
    bus = await Bus.start(settings, t.CLIENT)
    try:
        for n in range(RESULTS):
            result = InferenceResult(request_id=f"r{n}", tenant=TENANTS[n % 2], status=ResultStatus.OK, text="x" * 50)
            for _ in range(2):  # a resend: the same record id twice on the log
                await bus.publisher.publish(bus.topics.name(t.RESULTS), result, key=result.request_id)
        for n in range(COSTS):
            cost = CostRecord(request_id=f"r{n}", record_id=f"r{n}", tenant=TENANTS[n % 2], model="m", cost_usd=0.0)
            await bus.publisher.publish(bus.topics.name(t.COSTS), cost, key=cost.record_id)
        for n in range(FEEDBACK):
            feedback = Feedback(request_id=f"r{n}", tenant=TENANTS[n % 2], score=0.5)
            await bus.publisher.publish(bus.topics.name(t.FEEDBACK), feedback, key=feedback.request_id)
    finally:
        await bus.stop()


def archive_env(tmp_path: Path, uri: str, local: bool) -> dict[str, str]:
    return {
        "LLMBUS_ARCHIVE_DIR": str(tmp_path / "archive"),
        "LLMBUS_ARCHIVE_S3_URI": uri,
        "LLMBUS_ARCHIVE_LOCAL": "true" if local else "false",
        "LLMBUS_ARCHIVE_FETCH_MAX_WAIT_MS": "200",
        "LLMBUS_ARCHIVE_PROMPTS": "false",
    }


async def wait_for(condition, timeout_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the archive did not write everything in time"
        await asyncio.sleep(0.5)


def complete(ids: dict[str, Counter[str]]) -> bool:
    return all(set(ids.get(kind, Counter())) >= want for kind, want in expected().items()) and (
        sum(ids.get("feedback", Counter()).values()) >= FEEDBACK
    )


@pytest.mark.parametrize("local", [True, False], ids=["bucket-and-directory", "bucket-only"])
async def test_the_archive_writes_each_record_once_to_its_bucket(
    tmp_path: Path, object_store: ObjectStore, bucket: str, services: list[ServiceProc], local: bool
) -> None:
    settings = fresh_settings()
    await ensure_catalog(settings)
    try:
        await publish_workload(settings)
        env = archive_env(tmp_path, f"s3://{bucket}/archive/", local)
        services.append(ServiceProc("llmbus_services.archive", settings, env).start())
        await wait_for(lambda: complete(bucket_ids(object_store, bucket, "archive/")), timeout_s=120)
        in_bucket = bucket_ids(object_store, bucket, "archive/")
        for kind, want in expected().items():
            assert set(in_bucket[kind]) == want and set(in_bucket[kind].values()) == {1}, kind
        assert sum(in_bucket["feedback"].values()) == FEEDBACK
        leftovers = [i.key for i in object_store.objects(bucket, "archive/") if i.key.endswith(TMP_SUFFIX)]
        assert leftovers == []
        manifests = [i.key for i in object_store.objects(bucket, "archive/_manifests/")]
        assert manifests and all(key.endswith(".json") for key in manifests)
        if local:
            for kind in expected():
                in_dir = Counter(read.read_table(tmp_path / "archive", kind).column("record_id").to_pylist())
                assert in_dir == in_bucket[kind], kind
        else:
            assert not (tmp_path / "archive").exists()
    finally:
        await drop_namespace(settings)


class CrashBeforeCopy(ObjectStore):
    """The store, dying (as the process would) when the batch's first data object is to be copied into place."""

    def copy(self, bucket: str, source_key: str, key: str) -> None:
        raise ObjectStoreError("killed between the commit point and the copy")


def result_rows(ids: list[str], first_offset: int) -> list[dict]:
    kind = KINDS_BY_NAME["results"]
    rows = []
    for i, rid in enumerate(ids):
        message = InferenceResult(request_id=rid, tenant="acme", status=ResultStatus.OK, text="hi")
        rows.append(row_of(kind, message, Source("llm.results", 0, first_offset + i, 1_700_000_000_000)))
    return rows


def test_a_batch_past_its_manifest_is_completed_at_the_next_start(object_store: ObjectStore, bucket: str) -> None:
    crashing = BucketArchiveStore(CrashBeforeCopy(), f"s3://{bucket}/a/")
    plan = plan_batch("llm.results", 0, result_rows(["r1", "r2"], 0), [0, 1], [], crashing.known_ids)
    with pytest.raises(ObjectStoreError):
        crashing.write(plan)
    # An uncommitted batch's leftover: a data object with no manifest naming it.
    object_store.put_bytes(bucket, "a/results/day=2023-11-14/tenant=acme/orphan.parquet.tmp", b"partial")
    restarted = BucketArchiveStore(object_store, f"s3://{bucket}/a/")
    assert restarted.recover(orphan_age_s=0) == (1, 1)
    keys = [info.key for info in object_store.objects(bucket, "a/")]
    assert not [key for key in keys if key.endswith(TMP_SUFFIX)]
    assert restarted.archived_ranges("llm.results", 0)[0].first == 0
    assert restarted.known_ids(next(iter(plan.files)).parent) == {"acme/r1", "acme/r2"}
    # The batch delivered again (its offsets were never committed): inside the manifest's range, skipped.
    again = plan_batch(
        "llm.results",
        0,
        result_rows(["r1", "r2"], 0),
        [0, 1],
        restarted.archived_ranges("llm.results", 0),
        restarted.known_ids,
    )
    assert again.offsets is None and again.redelivered == 2
