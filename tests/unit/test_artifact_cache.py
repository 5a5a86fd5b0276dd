"""The node's artifact cache and fetch on local files: verify, resume, LRU eviction, leases, one download.

Sources are real directories (file:// artifacts); where a test needs a source that fails or is slow,
a thin wrapper around the directory source does it. The object store's own tests are in
tests/integration/test_artifacts_store.py.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from llmbus.artifacts import (
    ArtifactCache,
    ArtifactCorrupt,
    ArtifactMissing,
    ArtifactSizeMismatch,
    CacheFull,
    CacheSettings,
    StoreUnavailable,
    artifact_id,
    fetch_artifact,
    push_directory,
)
from llmbus.artifacts.fetch import DirectorySource
from llmbus.artifacts.location import parse_location
from llmbus.artifacts.store import ObjectStoreError
from llmbus.contract.messages.artifacts import ArtifactFile, ModelArtifact

KIB = 1024


def make_model(root: Path, name: str, sizes: dict[str, int], seed: int = 0) -> ModelArtifact:
    """A directory of files with random bytes, described in place as a file:// artifact."""
    directory = root / name
    directory.mkdir(parents=True)
    for i, (path, size) in enumerate(sizes.items()):
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_bytes(os.urandom(size) if size else b"")
        del i
    return push_directory(directory, f"file://{directory}/", format="fp32")


def cache_at(tmp_path: Path, **settings: object) -> ArtifactCache:
    return ArtifactCache(CacheSettings(dir=tmp_path / "cache", **settings))  # type: ignore[arg-type]


class FailingAfter:
    """The directory source, but the first read of each file breaks after `limit` bytes (a dropped connection)."""

    def __init__(self, inner: DirectorySource, limit: int) -> None:
        self.inner, self.limit = inner, limit
        self.offsets: list[tuple[str, int]] = []

    def describe(self, path: str) -> tuple[int, str]:
        return self.inner.describe(path)

    @contextlib.contextmanager
    def read(self, path: str, offset: int) -> Iterator[Iterator[bytes]]:
        self.offsets.append((path, offset))
        first = len([p for p, _ in self.offsets if p == path]) == 1
        with self.inner.read(path, offset) as chunks:

            def cut() -> Iterator[bytes]:
                sent = 0
                for chunk in chunks:
                    if first and sent + len(chunk) > self.limit:
                        yield chunk[: self.limit - sent]
                        raise ObjectStoreError("connection reset by peer")
                    sent += len(chunk)
                    yield chunk

            yield cut()


def test_fetch_puts_every_file_in_place_verified(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 300 * KIB, "cfg/config.json": 2 * KIB, "empty": 0})
    cache = cache_at(tmp_path)
    fetched = fetch_artifact(artifact, cache)
    assert not fetched.cache_hit and fetched.downloaded_bytes == artifact.size_bytes
    source = Path(parse_location(artifact.uri).root)
    for file in artifact.files:
        assert (fetched.path / file.path).read_bytes() == (source / file.path).read_bytes()
    assert not list(fetched.path.rglob("*.part*"))
    assert cache.is_complete(artifact_id(artifact))
    fetched.lease.release()
    again = fetch_artifact(artifact, cache)
    assert again.cache_hit and again.downloaded_bytes == 0 and again.path == fetched.path
    again.lease.release()


def test_a_broken_download_resumes_where_it_stopped(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 3 * 1024 * KIB})
    cache = cache_at(tmp_path, store_retry_s=0)
    source = FailingAfter(DirectorySource(parse_location(artifact.uri)), limit=1024 * KIB + 17)
    with pytest.raises(StoreUnavailable):  # no retry budget: the start fails, the partial file stays
        fetch_artifact(artifact, cache, source)
    part = cache.path(artifact_id(artifact)) / "model.safetensors.part"
    assert part.stat().st_size == 1024 * KIB + 17
    fetched = fetch_artifact(artifact, cache, source)  # the next start (or retry) continues from there
    assert source.offsets == [("model.safetensors", 0), ("model.safetensors", 1024 * KIB + 17)]
    assert fetched.downloaded_bytes == artifact.size_bytes - (1024 * KIB + 17)
    assert (fetched.path / "model.safetensors").read_bytes() == (
        Path(parse_location(artifact.uri).root) / "model.safetensors"
    ).read_bytes()
    fetched.lease.release()


def test_a_retry_within_the_budget_resumes_without_failing(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 2 * 1024 * KIB})
    source = FailingAfter(DirectorySource(parse_location(artifact.uri)), limit=512 * KIB)
    fetched = fetch_artifact(artifact, cache_at(tmp_path, store_retry_s=30), source)
    assert [offset for _, offset in source.offsets] == [0, 512 * KIB]
    assert fetched.downloaded_bytes == artifact.size_bytes
    fetched.lease.release()


def test_a_partial_of_a_file_written_again_starts_over(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 2 * 1024 * KIB})
    cache = cache_at(tmp_path, store_retry_s=0)
    source = FailingAfter(DirectorySource(parse_location(artifact.uri)), limit=700 * KIB)
    with pytest.raises(StoreUnavailable):
        fetch_artifact(artifact, cache, source)
    original = Path(parse_location(artifact.uri).root) / "model.safetensors"
    stat = original.stat()
    os.utime(original, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the source's tag changes
    fetch_artifact(artifact, cache, source).lease.release()
    assert [offset for _, offset in source.offsets] == [0, 0]


def test_a_digest_mismatch_is_refused_and_never_marked_usable(tmp_path: Path) -> None:
    good = make_model(tmp_path, "m", {"model.safetensors": 64 * KIB, "config.json": KIB})
    files = [f if f.path != "model.safetensors" else f.model_copy(update={"sha256": "0" * 64}) for f in good.files]
    artifact = good.model_copy(update={"files": files})
    cache = cache_at(tmp_path)
    with pytest.raises(ArtifactCorrupt, match=r"model\.safetensors: sha256 [0-9a-f]{64}, the artifact lists 0000"):
        fetch_artifact(artifact, cache)
    entry = cache.path(artifact_id(artifact))
    assert not cache.is_complete(artifact_id(artifact))
    assert not (entry / "model.safetensors").exists() and not (entry / "model.safetensors.part").exists()
    with pytest.raises(ArtifactCorrupt):  # and again on the next try: downloaded afresh, refused again
        fetch_artifact(artifact, cache)


def test_a_wrong_size_is_refused_before_a_byte_is_read(tmp_path: Path) -> None:
    good = make_model(tmp_path, "m", {"model.safetensors": 64 * KIB})
    artifact = good.model_copy(update={"files": [good.files[0].model_copy(update={"size_bytes": 65 * KIB})]})
    source = FailingAfter(DirectorySource(parse_location(artifact.uri)), limit=10**9)
    with pytest.raises(ArtifactSizeMismatch, match="the source has 65536 bytes, the artifact lists 66560"):
        fetch_artifact(artifact, cache_at(tmp_path), source)
    assert source.offsets == []


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    good = make_model(tmp_path, "m", {"model.safetensors": KIB})
    extra = ArtifactFile(path="tokenizer.json", sha256="1" * 64, size_bytes=10)
    with pytest.raises(ArtifactMissing, match=r"tokenizer\.json: no such file"):
        fetch_artifact(good.model_copy(update={"files": [*good.files, extra]}), cache_at(tmp_path))


def test_a_path_leaving_the_artifact_is_refused(tmp_path: Path) -> None:
    good = make_model(tmp_path, "m", {"model.safetensors": KIB})
    evil = good.files[0].model_copy(update={"path": "../../outside"})
    with pytest.raises(ValueError, match="stays inside the artifact"):
        fetch_artifact(good.model_copy(update={"files": [evil]}), cache_at(tmp_path))
    assert not (tmp_path / "outside").exists()


def test_a_damaged_cached_file_is_fetched_again(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 32 * KIB, "config.json": KIB})
    cache = cache_at(tmp_path)
    fetch_artifact(artifact, cache).lease.release()
    entry = cache.path(artifact_id(artifact))
    (entry / "config.json").write_bytes(b"{}")  # changed on disk after it was verified
    fetched = fetch_artifact(artifact, cache)
    assert not fetched.cache_hit and fetched.downloaded_bytes == KIB
    assert (entry / "config.json").stat().st_size == KIB
    fetched.lease.release()


def test_verify_on_hit_rehashes_a_cached_artifact(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 32 * KIB})
    cache = cache_at(tmp_path, verify_on_hit=True)
    fetch_artifact(artifact, cache).lease.release()
    path = cache.path(artifact_id(artifact)) / "model.safetensors"
    path.write_bytes(os.urandom(32 * KIB))  # same size, other bytes: only a digest sees it
    fetched = fetch_artifact(artifact, cache)
    assert not fetched.cache_hit and fetched.downloaded_bytes == 32 * KIB
    fetched.lease.release()


def test_the_least_recently_used_unleased_artifact_is_evicted(tmp_path: Path) -> None:
    a, b, c = (make_model(tmp_path, name, {"w": 100 * KIB}) for name in "abc")
    cache = cache_at(tmp_path, max_bytes=250 * KIB)
    for artifact in (a, b):
        fetch_artifact(artifact, cache).lease.release()
        time.sleep(0.02)
    os.utime(cache.path(artifact_id(a)) / ".llmbus" / "complete")  # a used again: b is now the oldest
    fetch_artifact(a, cache).lease.release()
    fetch_artifact(c, cache).lease.release()
    assert cache.is_complete(artifact_id(a)) and cache.is_complete(artifact_id(c))
    assert not cache.path(artifact_id(b)).exists()
    assert cache.usage_bytes() <= 250 * KIB


def test_an_artifact_a_live_worker_holds_is_never_evicted(tmp_path: Path) -> None:
    a, b = (make_model(tmp_path, name, {"w": 100 * KIB}) for name in "ab")
    cache = cache_at(tmp_path, max_bytes=150 * KIB)
    held = fetch_artifact(a, cache)  # a live worker serves it: its lease stays held
    with pytest.raises(CacheFull, match="held by artifacts in use"):
        fetch_artifact(b, cache)
    assert cache.is_complete(artifact_id(a))
    held.lease.release()
    fetch_artifact(b, cache).lease.release()  # released (the worker ended): now it may go
    assert not cache.path(artifact_id(a)).exists()


def test_an_artifact_larger_than_the_cache_is_refused_before_anything_is_evicted(tmp_path: Path) -> None:
    a, big = make_model(tmp_path, "a", {"w": 50 * KIB}), make_model(tmp_path, "big", {"w": 200 * KIB})
    cache = cache_at(tmp_path, max_bytes=150 * KIB)
    fetch_artifact(a, cache).lease.release()
    with pytest.raises(CacheFull, match="larger than the cache"):
        fetch_artifact(big, cache)
    assert cache.is_complete(artifact_id(a))


def _hold_lease_until_killed(cache_dir: str, artifact_json: str, ready: multiprocessing.synchronize.Event) -> None:
    cache = ArtifactCache(CacheSettings(dir=Path(cache_dir)))
    fetched = fetch_artifact(ModelArtifact.model_validate_json(artifact_json), cache)
    assert fetched.lease.held
    ready.set()
    time.sleep(600)


def test_a_killed_workers_lease_pins_nothing(tmp_path: Path) -> None:
    a, b = (make_model(tmp_path, name, {"w": 100 * KIB}) for name in "ab")
    cache = cache_at(tmp_path, max_bytes=150 * KIB)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    worker = ctx.Process(target=_hold_lease_until_killed, args=(str(cache.root), a.model_dump_json(), ready))
    worker.start()
    try:
        assert ready.wait(30)
        with pytest.raises(CacheFull):
            fetch_artifact(b, cache)
    finally:
        worker.kill()
        worker.join(10)
    fetch_artifact(b, cache).lease.release()  # the kernel dropped the dead worker's lock
    assert not cache.path(artifact_id(a)).exists()


class SlowDirectory(DirectorySource):
    """A directory read slowly, each read counted in a file (so two processes' reads add up)."""

    def __init__(self, artifact: ModelArtifact, counter: Path) -> None:
        super().__init__(parse_location(artifact.uri))
        object.__setattr__(self, "counter", counter)

    def read(self, path: str, offset: int) -> AbstractContextManager[Iterator[bytes]]:
        with open(self.counter, "a") as handle:  # type: ignore[attr-defined]
            handle.write(f"{os.getpid()} {path}\n")
        time.sleep(0.3)  # long enough that the other process arrives while this one downloads
        return super().read(path, offset)


def _fetch_in_child(cache_dir: str, artifact_json: str, counter: str, out: str) -> None:
    artifact = ModelArtifact.model_validate_json(artifact_json)
    fetched = fetch_artifact(
        artifact, ArtifactCache(CacheSettings(dir=Path(cache_dir))), SlowDirectory(artifact, Path(counter))
    )
    Path(out).write_text(f"{fetched.downloaded_bytes} {fetched.cache_hit} {fetched.path}")


def test_two_processes_fetching_one_artifact_download_it_once(tmp_path: Path) -> None:
    artifact = make_model(tmp_path, "m", {"model.safetensors": 256 * KIB, "config.json": KIB, "tokenizer.json": KIB})
    counter = tmp_path / "reads"
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=_fetch_in_child,
            args=(str(tmp_path / "cache"), artifact.model_dump_json(), str(counter), str(tmp_path / f"out{i}")),
        )
        for i in range(2)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    reads = counter.read_text().splitlines()
    assert sorted(line.split()[1] for line in reads) == sorted(f.path for f in artifact.files)  # each file once
    results = sorted((tmp_path / f"out{i}").read_text().split() for i in range(2))
    assert results[0][:2] == ["0", "True"] and results[1][:2] == [str(artifact.size_bytes), "False"]
    assert results[0][2] == results[1][2]  # one directory, shared
