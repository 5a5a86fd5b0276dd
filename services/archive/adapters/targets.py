"""The archive's targets as configured: the directory, the bucket, or both (each recovered at start)."""

from __future__ import annotations

import logging

from llmbus.artifacts.store import ObjectStore
from llmbus_services.archive.adapters.bucket_store import BucketArchiveStore
from llmbus_services.archive.adapters.store import ArchiveStore
from llmbus_services.archive.config import ArchiveSettings
from llmbus_services.archive.core.ports import ArchiveTarget

log = logging.getLogger(__name__)


def open_targets(cfg: ArchiveSettings) -> list[ArchiveTarget]:
    """The directory first when there is one (the metrics count its outcomes), then the bucket."""
    targets: list[ArchiveTarget] = []
    if cfg.local:
        cfg.dir.mkdir(parents=True, exist_ok=True)
        local = ArchiveStore(cfg.dir, id_cache_dirs=cfg.id_cache_dirs, compression=cfg.compression)
        completed, removed = local.recover(cfg.orphan_age_s)
        log.info("archive at %s: %d files completed, %d unfinished ones removed", cfg.dir, completed, removed)
        targets.append(local)
    if cfg.s3_uri:
        bucket = BucketArchiveStore(
            ObjectStore(), cfg.s3_uri, id_cache_dirs=cfg.id_cache_dirs, compression=cfg.compression
        )
        completed, removed = bucket.recover(cfg.orphan_age_s)
        log.info("archive at %s: %d objects completed, %d unfinished ones removed", bucket.uri, completed, removed)
        targets.append(bucket)
    return targets
