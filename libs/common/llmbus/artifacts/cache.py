"""The node-local artifact cache: one directory per node, shared by every worker on it, bounded in size.

    <dir>/<id>/<path>                   an artifact's files under their own paths (what vLLM loads)
    <dir>/<id>/<path>.part[.tag]        a file being downloaded (resumed from its length; tag: the source's etag)
    <dir>/<id>/.llmbus/artifact.json    the artifact, written when its download is admitted (its size is reserved)
    <dir>/<id>/.llmbus/complete         written once every file is verified: the artifact is usable; its mtime
                                        is the artifact's last use (least recently used goes first)
    <dir>/.locks/<id>.lease             every worker using the artifact holds a shared lock on it while it lives
    <dir>/.locks/<id>.download          the one process downloading the artifact holds it exclusively
    <dir>/.locks/cache                  admission and eviction, one process at a time

An artifact's id is a digest of its files (path, sha256, size): the same bytes pushed twice are one entry.
Eviction takes an entry's lease lock exclusively: it cannot while any live worker holds it shared, so an
artifact in use is never removed, and a worker that died (its locks dropped by the kernel) pins nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from llmbus.artifacts.errors import CacheFull
from llmbus.artifacts.locks import FileLock, hold, try_hold
from llmbus.contract.messages.artifacts import ModelArtifact
from llmbus.settings import cache_root

GIB = 1024**3
META = ".llmbus"
LOCKS = ".locks"


class CacheSettings(BaseSettings):
    """The node's artifact cache (env prefix LLMBUS_ARTIFACT_CACHE_); every worker of a node names the same dir."""

    model_config = SettingsConfigDict(env_prefix="LLMBUS_ARTIFACT_CACHE_", extra="ignore")

    dir: Path = Field(default_factory=lambda: cache_root() / "artifacts")
    max_bytes: int = Field(default=200 * GIB, gt=0)  # what the cache may hold, downloads in progress included
    verify_on_hit: bool = False  # re-hash a cached artifact's files at every start (verified once when fetched)
    download_wait_s: float = Field(default=4 * 3600.0, gt=0)  # waiting for another worker's download of it
    fetch_threads: int = Field(default=4, ge=1)  # files downloaded (and hashed) at the same time
    # A failing store is retried (the download resumes) for this long before the start fails.
    store_retry_s: float = Field(default=300.0, ge=0)


def artifact_id(artifact: ModelArtifact) -> str:
    """A digest of the artifact's files: its cache entry's name."""
    listing = "\n".join(f"{f.path}\0{f.sha256}\0{f.size_bytes}" for f in sorted(artifact.files, key=lambda f: f.path))
    return hashlib.sha256(listing.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Entry:
    id: str
    size_bytes: int  # the larger of what it declared (its reservation) and what is on disk
    last_used: float
    complete: bool


class ArtifactCache:
    def __init__(self, settings: CacheSettings | None = None) -> None:
        self.settings = settings or CacheSettings()
        self.root = self.settings.dir
        (self.root / LOCKS).mkdir(parents=True, exist_ok=True)

    def path(self, aid: str) -> Path:
        return self.root / aid

    def lease(self, aid: str, timeout_s: float = 120.0) -> FileLock:
        """Hold the entry against eviction (shared with the node's other workers) until released."""
        return hold(self._lock_path(aid, "lease"), exclusive=False, timeout_s=timeout_s)

    def downloading(self, aid: str, timeout_s: float | None = None) -> FileLock:
        """Be the one process that downloads the entry; others wait here, then find it complete."""
        wait_s = self.settings.download_wait_s if timeout_s is None else timeout_s
        return hold(self._lock_path(aid, "download"), exclusive=True, timeout_s=wait_s)

    def is_complete(self, aid: str) -> bool:
        return (self.path(aid) / META / "complete").is_file()

    def touch(self, aid: str) -> None:
        """Mark a use (the least recently used entry is evicted first)."""
        os.utime(self.path(aid) / META / "complete")

    def mark_complete(self, aid: str) -> None:
        _write_aside(self.path(aid) / META / "complete", str(int(time.time())).encode())

    def admit(self, aid: str, artifact: ModelArtifact) -> list[str]:
        """Reserve the artifact's size, evicting least recently used entries no live worker leases.
        The caller holds the entry's lease (so it is not a candidate itself). Returns the evicted ids;
        CacheFull when in-use entries leave no room."""
        need = artifact.size_bytes
        if need > self.settings.max_bytes:
            raise CacheFull(
                f"the artifact ({need / GIB:.2f} GiB) is larger than the cache"
                f" ({self.settings.max_bytes / GIB:.2f} GiB, LLMBUS_ARTIFACT_CACHE_MAX_BYTES)"
            )
        evicted: list[str] = []
        with hold(self.root / LOCKS / "cache", exclusive=True, timeout_s=600):
            others = [entry for entry in self.entries() if entry.id != aid]
            used = sum(entry.size_bytes for entry in others)
            for entry in sorted(others, key=lambda e: e.last_used):
                if used + need <= self.settings.max_bytes:
                    break
                if self._evict(entry.id):
                    used -= entry.size_bytes
                    evicted.append(entry.id)
            if used + need > self.settings.max_bytes:
                raise CacheFull(
                    f"{need / GIB:.2f} GiB needed, {used / GIB:.2f} GiB of {self.settings.max_bytes / GIB:.2f} GiB"
                    f" held by artifacts in use ({self.root}; LLMBUS_ARTIFACT_CACHE_MAX_BYTES)"
                )
            meta = self.path(aid) / META
            meta.mkdir(parents=True, exist_ok=True)
            _write_aside(meta / "artifact.json", artifact.model_dump_json(exclude_none=True).encode())
        return evicted

    def entries(self) -> list[Entry]:
        found = []
        for child in self.root.iterdir():
            if child.name.startswith(".") or not child.is_dir():
                continue
            try:
                found.append(_entry(child))
            except FileNotFoundError:  # evicted by another process while we looked (outside the cache lock)
                continue
        return found

    def usage_bytes(self) -> int:
        return sum(entry.size_bytes for entry in self.entries())

    def _evict(self, aid: str) -> bool:
        """Remove an entry nobody leases; False when a live worker holds it (or is downloading it)."""
        lease = try_hold(self._lock_path(aid, "lease"), exclusive=True)
        if lease is None:
            return False
        with lease:
            shutil.rmtree(self.path(aid), ignore_errors=True)
            self._lock_path(aid, "download").unlink(missing_ok=True)
            lease.path.unlink(missing_ok=True)  # while held: a waiter re-opens the path it names (locks.py)
        return True

    def _lock_path(self, aid: str, kind: str) -> Path:
        return self.root / LOCKS / f"{aid}.{kind}"


def _entry(directory: Path) -> Entry:
    meta = directory / META
    complete = meta / "complete"
    declared = 0
    if (meta / "artifact.json").is_file():
        declared = ModelArtifact.model_validate_json((meta / "artifact.json").read_bytes()).size_bytes
    on_disk = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    last_used = (complete if complete.is_file() else directory).stat().st_mtime
    return Entry(directory.name, max(declared, on_disk), last_used, complete.is_file())


def _write_aside(path: Path, data: bytes) -> None:
    aside = path.with_name(path.name + ".tmp")
    with open(aside, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(aside, path)
