"""Artifacts on the real local object store (deploy/objectstore): push, fetch, verify, resume, one download
per node, and the refusals. Each test has a bucket of its own; GetObject requests are counted by the
store itself (its /metrics)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmbus.artifacts import (
    MANIFEST_NAME,
    ArtifactCache,
    ArtifactCorrupt,
    ArtifactMissing,
    ArtifactSizeMismatch,
    CacheSettings,
    ObjectStore,
    fetch_artifact,
    push_directory,
    read_artifact,
)
from llmbus.artifacts.fetch import StoreSource
from llmbus.artifacts.location import parse_location
from llmbus.artifacts.store import ObjectStoreError
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.settings import MIB, ObjectStoreSettings
from tests.fixtures.objectstore import store_requests

pytestmark = [pytest.mark.objectstore]


def model_dir(root: Path, sizes: dict[str, int]) -> Path:
    directory = root / "model"
    for path, size in sizes.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(os.urandom(size))
    return directory


def test_push_then_fetch_gives_back_every_byte_verified(tmp_path: Path, object_store: ObjectStore, bucket: str) -> None:
    # 12 MiB in 5 MiB parts: a multipart upload of three parts
    store = ObjectStore(ObjectStoreSettings(part_size_bytes=5 * MIB))
    source = model_dir(tmp_path, {"model.safetensors": 12 * MIB, "config.json": 700, "tok/tokenizer.json": 30_000})
    artifact = push_directory(source, f"s3://{bucket}/tiny/1/fp32", format="fp32", store=store)
    assert artifact.uri == f"s3://{bucket}/tiny/1/fp32/"
    listed = {info.key: info.size_bytes for info in object_store.objects(bucket)}
    assert listed.pop(f"tiny/1/fp32/{MANIFEST_NAME}") > 0
    assert listed == {f"tiny/1/fp32/{f.path}": f.size_bytes for f in artifact.files}
    assert object_store.stat(bucket, "tiny/1/fp32/model.safetensors").etag.endswith("-3")  # three parts
    assert read_artifact(artifact.uri, object_store) == artifact

    fetched = fetch_artifact(artifact, ArtifactCache(CacheSettings(dir=tmp_path / "cache")), store=object_store)
    for file in artifact.files:
        assert (fetched.path / file.path).read_bytes() == (source / file.path).read_bytes()
    assert store_requests(bucket) == len(artifact.files) + 1  # each file once, and the manifest read above
    fetched.lease.release()


def _fetch_in_child(cache_dir: str, artifact_json: str, out: str) -> None:
    fetched = fetch_artifact(
        ModelArtifact.model_validate_json(artifact_json), ArtifactCache(CacheSettings(dir=Path(cache_dir)))
    )
    Path(out).write_text(f"{fetched.downloaded_bytes} {fetched.cache_hit}")


def test_two_processes_of_one_node_download_an_artifact_once(
    tmp_path: Path, object_store: ObjectStore, bucket: str
) -> None:
    source = model_dir(tmp_path, {"model.safetensors": 24 * MIB, "config.json": 700, "tokenizer.json": 30_000})
    artifact = push_directory(source, f"s3://{bucket}/m/1/", format="fp32", store=object_store)
    before = store_requests(bucket)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=_fetch_in_child,
            args=(str(tmp_path / "cache"), artifact.model_dump_json(), str(tmp_path / f"out{i}")),
        )
        for i in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    assert store_requests(bucket) - before == len(artifact.files)  # the store served each file once
    outcomes = sorted((tmp_path / f"out{i}").read_text() for i in range(2))
    assert outcomes == ["0 True", f"{artifact.size_bytes} False"]


class DroppedOnce:
    """The store's source, with its first GET cut after `limit` bytes (a connection the network dropped)."""

    def __init__(self, inner: StoreSource, limit: int) -> None:
        self.inner, self.limit, self.offsets = inner, limit, list[int]()

    def describe(self, path: str) -> tuple[int, str]:
        return self.inner.describe(path)

    @contextlib.contextmanager
    def read(self, path: str, offset: int) -> Iterator[Iterator[bytes]]:
        self.offsets.append(offset)
        with self.inner.read(path, offset) as chunks:

            def cut() -> Iterator[bytes]:
                sent = 0
                for chunk in chunks:
                    if len(self.offsets) == 1 and sent + len(chunk) > self.limit:
                        yield chunk[: self.limit - sent]
                        raise ObjectStoreError("connection reset")
                    sent += len(chunk)
                    yield chunk

            yield cut()


def test_a_dropped_download_resumes_with_a_ranged_get(tmp_path: Path, object_store: ObjectStore, bucket: str) -> None:
    source_dir = model_dir(tmp_path, {"model.safetensors": 6 * MIB})
    artifact = push_directory(source_dir, f"s3://{bucket}/m/1/", format="fp32", store=object_store)
    source = DroppedOnce(StoreSource(object_store, parse_location(artifact.uri)), limit=2 * MIB + 5)
    before = store_requests(bucket)
    fetched = fetch_artifact(artifact, ArtifactCache(CacheSettings(dir=tmp_path / "cache", store_retry_s=30)), source)
    assert source.offsets == [0, 2 * MIB + 5]
    assert store_requests(bucket) - before == 2
    assert (fetched.path / "model.safetensors").read_bytes() == (source_dir / "model.safetensors").read_bytes()
    fetched.lease.release()


def test_a_changed_missing_or_resized_object_is_refused(tmp_path: Path, object_store: ObjectStore, bucket: str) -> None:
    source = model_dir(tmp_path, {"model.safetensors": 256 * 1024, "config.json": 700, "tokenizer.json": 900})
    artifact = push_directory(source, f"s3://{bucket}/m/1/", format="fp32", store=object_store)
    prefix = "m/1/"
    object_store.put_bytes(bucket, prefix + "model.safetensors", os.urandom(256 * 1024))  # same size, other bytes
    object_store.put_bytes(bucket, prefix + "config.json", b"{}")  # another size
    object_store.delete(bucket, [prefix + "tokenizer.json"])

    def fetch_only(name: str) -> None:
        only = artifact.model_copy(update={"files": [f for f in artifact.files if f.path == name]})
        fetch_artifact(only, ArtifactCache(CacheSettings(dir=tmp_path / f"cache-{name}")), store=object_store)

    with pytest.raises(ArtifactCorrupt, match=r"model\.safetensors: sha256"):
        fetch_only("model.safetensors")
    with pytest.raises(ArtifactSizeMismatch, match=r"config\.json: the source has 2 bytes, the artifact lists 700"):
        fetch_only("config.json")
    with pytest.raises(ArtifactMissing, match=r"tokenizer\.json: not in the store"):
        fetch_only("tokenizer.json")
