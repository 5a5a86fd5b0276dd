"""Why an artifact cannot be served: each error names what was wanted and what was found.

`code` is what a worker's failed-start heartbeat and log carry (WorkerStatus.state_reason starts with it).
"""

from __future__ import annotations

from typing import ClassVar


class ArtifactError(Exception):
    code: ClassVar[str] = "artifact_error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.code}: {self.reason}"


class ArtifactMissing(ArtifactError):
    """A file the artifact lists is not in the store (or the directory), or the bucket is not there."""

    code = "artifact_missing"


class ArtifactSizeMismatch(ArtifactError):
    """A file in the store is not the size the artifact lists: another file, or one cut short."""

    code = "artifact_size_mismatch"


class ArtifactCorrupt(ArtifactError):
    """A downloaded file's sha256 is not the one the artifact lists."""

    code = "artifact_digest_mismatch"


class CacheFull(ArtifactError):
    """The node's cache cannot make room: what it holds is in use by live workers (or too small)."""

    code = "artifact_cache_full"


class StoreUnavailable(ArtifactError):
    """The object store did not answer (or failed) for longer than the fetch's retry budget."""

    code = "artifact_store_unavailable"


class NoArtifactFits(ArtifactError):
    """None of the model version's artifacts runs on this node (format, memory)."""

    code = "no_artifact_fits"
