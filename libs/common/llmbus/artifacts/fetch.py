"""Fetch an artifact into the node's cache, verify it and hold it: what a worker does before it loads a model.

    fetched = fetch_artifact(artifact, ArtifactCache(), store=ObjectStore())   # blocking: run it in a thread
    ... the engine loads fetched.path ...; the lease (fetched.lease) lasts as long as the process

Two phases, timed separately (a worker's `fetch` and `verify` cold-start phases):
  fetch   each file not in the cache yet is downloaded to `<path>.part`, resumed from the length an
          earlier (killed, failed) download left if the source's etag is unchanged, else from 0; the
          source's size is checked first, so a file of the wrong size is refused before a byte moves.
          A store that fails is retried, resuming, for `store_retry_s`.
  verify  each downloaded file's size and sha256 against the artifact, then renamed into place; the
          entry is complete once all are. A mismatch removes the file (a later try downloads it again).
One process of a node downloads an entry (its download lock); another worker wanting it waits, then
finds it complete and uses it as it is: nothing is downloaded twice. A complete entry is checked on
every use (sizes; sha256 too with verify_on_hit); a damaged file is removed and fetched again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from llmbus.artifacts.cache import META, ArtifactCache, artifact_id
from llmbus.artifacts.errors import ArtifactCorrupt, ArtifactMissing, ArtifactSizeMismatch, StoreUnavailable
from llmbus.artifacts.location import Location, parse_location, safe_relative
from llmbus.artifacts.locks import FileLock
from llmbus.artifacts.push import HASH_CHUNK_BYTES, sha256_of
from llmbus.artifacts.store import ObjectMissing, ObjectStore, ObjectStoreError
from llmbus.contract.messages.artifacts import ArtifactFile, ModelArtifact

log = logging.getLogger(__name__)
T = TypeVar("T")


class Source(Protocol):
    """Where an artifact's files are read from."""

    def describe(self, path: str) -> tuple[int, str]:
        """(size in bytes, a tag that changes when the file is written again); ArtifactMissing if absent."""
        ...

    def read(self, path: str, offset: int) -> AbstractContextManager[Iterator[bytes]]: ...


@dataclass(frozen=True)
class StoreSource:
    store: ObjectStore
    location: Location

    def describe(self, path: str) -> tuple[int, str]:
        try:
            info = self.store.stat(self.location.bucket, self.location.key(path))
        except ObjectMissing as exc:
            raise ArtifactMissing(f"{self.location.uri}{path}: not in the store ({exc})") from exc
        return info.size_bytes, info.etag

    def read(self, path: str, offset: int) -> AbstractContextManager[Iterator[bytes]]:
        return self.store.stream(self.location.bucket, self.location.key(path), offset)


@dataclass(frozen=True)
class DirectorySource:
    location: Location

    def describe(self, path: str) -> tuple[int, str]:
        try:
            stat = os.stat(self.location.key(path))
        except FileNotFoundError as exc:
            raise ArtifactMissing(f"{self.location.uri}{path}: no such file") from exc
        return stat.st_size, f"{stat.st_size}-{stat.st_mtime_ns}"

    @contextlib.contextmanager
    def read(self, path: str, offset: int) -> Iterator[Iterator[bytes]]:
        with open(self.location.key(path), "rb") as handle:
            handle.seek(offset)
            yield iter(lambda: handle.read(HASH_CHUNK_BYTES), b"")


def source_for(artifact: ModelArtifact, store: ObjectStore | None = None) -> Source:
    location = parse_location(artifact.uri)
    if location.scheme == "file":
        return DirectorySource(location)
    return StoreSource(store or ObjectStore(), location)


@dataclass
class Progress:
    """What a fetch has done so far (read by a heartbeat while the fetch runs in its thread)."""

    total_bytes: int = 0
    done_bytes: int = 0  # of the artifact, in the cache (downloaded now or before)
    moved_bytes: int = 0  # read from the source by this fetch, every try included
    phase: str = "fetch"
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n_bytes: int, *, moved: bool = True) -> None:
        with self._lock:
            self.done_bytes += n_bytes
            self.moved_bytes += n_bytes if moved else 0


@dataclass
class Fetched:
    artifact: ModelArtifact
    path: Path  # the artifact's directory in the cache: its files under their paths
    lease: FileLock  # held: the entry is not evicted while this process lives (or until released)
    fetch_s: float
    verify_s: float
    downloaded_bytes: int  # by this process; 0 on a cache hit
    cache_hit: bool


def fetch_artifact(
    artifact: ModelArtifact,
    cache: ArtifactCache,
    source: Source | None = None,
    *,
    store: ObjectStore | None = None,
    progress: Progress | None = None,
) -> Fetched:
    """The artifact, verified, in the node's cache; raises an ArtifactError saying what is wrong."""
    for file in artifact.files:
        safe_relative(file.path)  # a path leaving the entry is refused before anything is written
    source = source or source_for(artifact, store)
    progress = progress or Progress()
    progress.total_bytes = artifact.size_bytes
    aid = artifact_id(artifact)
    entry = cache.path(aid)
    lease = cache.lease(aid)
    try:
        started = time.monotonic()
        while True:
            if cache.is_complete(aid):
                checked_from = time.monotonic()
                damaged = _damaged_files(entry, artifact, rehash=cache.settings.verify_on_hit)
                if not damaged:
                    cache.touch(aid)
                    progress.done_bytes = artifact.size_bytes
                    now = time.monotonic()
                    return Fetched(artifact, entry, lease, checked_from - started, now - checked_from, 0, True)
                with cache.downloading(aid):
                    log.warning("cached artifact %s damaged (%s): fetching it again", aid, ", ".join(damaged))
                    (entry / META / "complete").unlink(missing_ok=True)
                    for path in damaged:
                        (entry / path).unlink(missing_ok=True)
                continue
            with cache.downloading(aid):
                if cache.is_complete(aid):
                    continue  # another worker of this node downloaded it while we waited
                cache.admit(aid, artifact)
                _retrying(
                    lambda: _download_all(source, artifact, entry, cache.settings.fetch_threads, progress),
                    cache.settings.store_retry_s,
                )
                verify_from = time.monotonic()
                progress.phase = "verify"
                _verify_all(artifact, entry, cache.settings.fetch_threads)
                cache.mark_complete(aid)
                now = time.monotonic()
                fetch_s, verify_s = verify_from - started, now - verify_from
                return Fetched(artifact, entry, lease, fetch_s, verify_s, progress.moved_bytes, False)
    except BaseException:
        lease.release()
        raise


def _download_all(source: Source, artifact: ModelArtifact, entry: Path, threads: int, progress: Progress) -> None:
    progress.done_bytes = sum(_present_bytes(entry, f) for f in artifact.files)
    with ThreadPoolExecutor(threads, thread_name_prefix="fetch") as pool:
        list(pool.map(lambda f: _download(source, f, entry, progress), artifact.files))


def _present_bytes(entry: Path, file: ArtifactFile) -> int:
    final, part = entry / file.path, entry / (file.path + ".part")
    if final.is_file():
        return final.stat().st_size
    return part.stat().st_size if part.is_file() else 0


def _download(source: Source, file: ArtifactFile, entry: Path, progress: Progress) -> None:
    """One file into its `.part` (resumed); nothing when it is in place already."""
    final = entry / file.path
    if final.is_file():
        return  # verified and renamed by an earlier, interrupted fetch of this entry
    size, tag = source.describe(file.path)
    if size != file.size_bytes:
        raise ArtifactSizeMismatch(f"{file.path}: the source has {size} bytes, the artifact lists {file.size_bytes}")
    part, tag_file = entry / (file.path + ".part"), entry / (file.path + ".part.tag")
    part.parent.mkdir(parents=True, exist_ok=True)
    resumable = part.is_file() and tag_file.is_file() and tag_file.read_text() == tag
    offset = part.stat().st_size if resumable else 0
    if offset > size:
        offset = 0
    if offset == 0:
        progress.add(-(part.stat().st_size if part.is_file() else 0), moved=False)
        part.write_bytes(b"")
        tag_file.write_text(tag)
    elif offset:
        log.info("%s: resuming at byte %d of %d", file.path, offset, size)
    if offset < size:
        with source.read(file.path, offset) as chunks, open(part, "ab") as out:
            for chunk in chunks:
                out.write(chunk)
                progress.add(len(chunk))
            out.flush()
            os.fsync(out.fileno())
    if part.stat().st_size != size:  # the connection ended early: resumed on the next try
        raise ObjectStoreError(f"{file.path}: read {part.stat().st_size} of {size} bytes")


def _verify_all(artifact: ModelArtifact, entry: Path, threads: int) -> None:
    with ThreadPoolExecutor(threads, thread_name_prefix="verify") as pool:
        list(pool.map(lambda f: _verify(f, entry), artifact.files))


def _verify(file: ArtifactFile, entry: Path) -> None:
    final, part = entry / file.path, entry / (file.path + ".part")
    if final.is_file():
        return
    size = part.stat().st_size
    digest = sha256_of(part) if size == file.size_bytes else None
    if digest != file.sha256:
        part.unlink(missing_ok=True)
        (entry / (file.path + ".part.tag")).unlink(missing_ok=True)
        if digest is None:
            raise ArtifactSizeMismatch(f"{file.path}: downloaded {size} bytes, the artifact lists {file.size_bytes}")
        raise ArtifactCorrupt(f"{file.path}: sha256 {digest}, the artifact lists {file.sha256}")
    os.replace(part, final)
    (entry / (file.path + ".part.tag")).unlink(missing_ok=True)


def _damaged_files(entry: Path, artifact: ModelArtifact, *, rehash: bool) -> list[str]:
    """Files of a complete entry that are missing, of the wrong size or (rehash) of the wrong digest."""
    damaged = []
    for file in artifact.files:
        path = entry / file.path
        wrong_size = not path.is_file() or path.stat().st_size != file.size_bytes
        if wrong_size or (rehash and sha256_of(path) != file.sha256):
            damaged.append(file.path)
    return damaged


def _retrying(attempt: Callable[[], T], budget_s: float) -> T:
    """Run `attempt` again (it resumes) while the store fails transiently, for at most `budget_s`."""
    deadline = time.monotonic() + budget_s
    delay_s = 1.0
    while True:
        try:
            return attempt()
        except ObjectMissing as exc:
            raise ArtifactMissing(str(exc)) from exc
        except ObjectStoreError as exc:
            if time.monotonic() + delay_s > deadline:
                raise StoreUnavailable(f"{exc} (retried for {budget_s:.0f}s)") from exc
            log.warning("object store failed (%s): resuming in %.0fs", exc, delay_s)
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 30.0)
