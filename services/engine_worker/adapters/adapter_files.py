"""A LoRA adapter's directory on this node, from its `source`: what an engine hands its LoRA loader.

- a local directory or `file:///dir/`: used as it is (it must hold adapter_config.json);
- an object-store artifact root `s3://<bucket>/<prefix>/` (what `llmbus models push` uploads for an adapter
  manifest): its manifest is read, then its files are fetched into the node's artifact cache and verified
  (size and sha256 of each), as a worker fetches its model (llmbus.artifacts.fetch_artifact), in a thread.

A fetched adapter's cache entry stays leased while the process lives (never evicted under it) and its
directory is remembered, so later requests with it wait for nothing. One fetch per source at a time.

The errors are the request's, never the worker's: a missing, resized or corrupt artifact (or a directory
without adapter_config.json) ends the request with AdapterUnavailable, final (no other worker can serve those
files either); a store that does not answer, or a cache with no room, is retryable (another worker, later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from llmbus.artifacts import (
    ArtifactCache,
    ArtifactError,
    ArtifactMissing,
    CacheFull,
    CacheSettings,
    ObjectMissing,
    ObjectStore,
    ObjectStoreError,
    StoreUnavailable,
    fetch_artifact,
    read_artifact,
)
from llmbus.artifacts.locks import FileLock, LockTimeout
from llmbus.contract.messages import ErrorCode, LoraAdapter
from llmbus_services.engine_worker.core.engine import EngineError, RequestRejected

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
STORE_RETRY_S = 30.0  # a request waits at most this long for a failing store (a model's start waits longer)


class AdapterUnavailable(RequestRejected):
    """The adapter's files cannot be had: missing, resized or corrupt in the store, not an adapter. Final."""

    code = ErrorCode.MODEL_UNAVAILABLE


class AdapterFetchFailed(EngineError):
    """The store did not answer, or the node's cache has no room: another worker (or a later try) may serve it."""

    code = ErrorCode.WORKER_ERROR


def local_dir(source: str) -> str:
    """The adapter's directory on this node from a local source (a path or file:// URI)."""
    if source.startswith("file://"):
        source = source.removeprefix("file://")
    elif "://" in source:
        raise RequestRejected(f"adapter source {source!r}: a local directory, file:// or s3:// is served here")
    if not (Path(source) / ADAPTER_CONFIG).is_file():
        raise RequestRejected(f"adapter source {source!r} has no {ADAPTER_CONFIG}")
    return source


class AdapterFiles:
    """Each adapter's local directory: local sources as they are, object-store ones fetched once and held."""

    def __init__(
        self,
        cache: Callable[[], ArtifactCache] | None = None,
        store: Callable[[], ObjectStore] | None = None,
    ) -> None:
        self._cache_factory = cache or _adapter_cache
        self._store_factory = store or ObjectStore
        self._store: ObjectStore | None = None
        self._fetched: dict[str, str] = {}  # source -> its verified directory in the cache
        self._leases: list[FileLock] = []
        self._fetching: dict[str, asyncio.Lock] = {}

    async def directory(self, adapter: LoraAdapter) -> str:
        """The directory vLLM loads `adapter` from; EngineError (a request's error) when it cannot be had."""
        source = adapter.source
        if not source.startswith("s3://"):
            return local_dir(source)
        if (known := self._fetched.get(source)) is not None:
            return known
        async with self._fetching.setdefault(source, asyncio.Lock()):
            if (known := self._fetched.get(source)) is not None:
                return known  # fetched by the request this one waited for
            path = await asyncio.to_thread(self._fetch, adapter)
            self._fetched[source] = path
            return path

    def _fetch(self, adapter: LoraAdapter) -> str:
        """Blocking: the artifact at the adapter's root, verified into the cache (its lease kept)."""
        try:
            store = self._store = self._store or self._store_factory()
            artifact = read_artifact(adapter.source, store)
            fetched = fetch_artifact(artifact, self._cache_factory(), store=store)
        except (ArtifactMissing, ObjectMissing) as exc:
            missing = exc if isinstance(exc, ArtifactError) else ArtifactMissing(str(exc))
            raise self._unavailable(adapter, missing) from exc
        except (StoreUnavailable, CacheFull, LockTimeout, ObjectStoreError) as exc:
            raise AdapterFetchFailed(
                f"LoRA adapter {adapter.name!r} could not be fetched from {adapter.source}: {exc}"
            ) from exc
        except ArtifactError as exc:  # a file of another size or digest than its artifact lists
            raise self._unavailable(adapter, exc) from exc
        except ValueError as exc:  # a manifest that is not an artifact, a file path leaving its root
            raise self._unavailable(adapter, ArtifactError(f"the artifact at its root is unreadable: {exc}")) from exc
        if not (fetched.path / ADAPTER_CONFIG).is_file():
            fetched.lease.release()
            raise self._unavailable(adapter, ArtifactMissing(f"its artifact has no {ADAPTER_CONFIG}"))
        self._leases.append(fetched.lease)
        log.info(
            "LoRA adapter %s: %s fetched to %s (%.2fs fetch, %.2fs verify, %d bytes downloaded)",
            adapter.name, adapter.source, fetched.path, fetched.fetch_s, fetched.verify_s, fetched.downloaded_bytes,
        )  # fmt: skip
        return str(fetched.path)

    @staticmethod
    def _unavailable(adapter: LoraAdapter, error: ArtifactError) -> AdapterUnavailable:
        log.error("LoRA adapter %s from %s cannot be served: %s", adapter.name, adapter.source, error)
        return AdapterUnavailable(f"LoRA adapter {adapter.name!r} cannot be served from {adapter.source}: {error}")

    def close(self) -> None:
        """Release the leases of the fetched adapters (the process's end does as much)."""
        for lease in self._leases:
            lease.release()
        self._leases.clear()
        self._fetched.clear()


def _adapter_cache() -> ArtifactCache:
    """The node's artifact cache, whose store retries are bounded for a request that waits on them."""
    settings = CacheSettings()
    return ArtifactCache(settings.model_copy(update={"store_retry_s": min(settings.store_retry_s, STORE_RETRY_S)}))
