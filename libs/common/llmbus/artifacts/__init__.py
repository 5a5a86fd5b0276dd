"""Model artifacts: the object store, pushing a directory as an artifact, the node's cache, fetching.

    from llmbus.artifacts import ObjectStore, push_directory, fetch_artifact, ArtifactCache

    artifact = push_directory(Path("llama-8b-bf16"), "s3://models/llama-8b/3/bf16/", format="bf16")
    fetched = fetch_artifact(artifact, ArtifactCache(), store=ObjectStore())   # verified, leased

store.py (the S3 client), location.py (s3:// and file:// URIs), push.py, cache.py, fetch.py, errors.py.
"""

from llmbus.artifacts.cache import ArtifactCache, CacheSettings, artifact_id
from llmbus.artifacts.errors import (
    ArtifactCorrupt,
    ArtifactError,
    ArtifactMissing,
    ArtifactSizeMismatch,
    CacheFull,
    NoArtifactFits,
    StoreUnavailable,
)
from llmbus.artifacts.fetch import Fetched, Progress, fetch_artifact
from llmbus.artifacts.location import MANIFEST_NAME, parse_location
from llmbus.artifacts.push import describe_directory, push_directory, read_artifact
from llmbus.artifacts.store import ObjectMissing, ObjectStore, ObjectStoreError

__all__ = [
    "MANIFEST_NAME",
    "ArtifactCache",
    "ArtifactCorrupt",
    "ArtifactError",
    "ArtifactMissing",
    "ArtifactSizeMismatch",
    "CacheFull",
    "CacheSettings",
    "Fetched",
    "NoArtifactFits",
    "ObjectMissing",
    "ObjectStore",
    "ObjectStoreError",
    "Progress",
    "StoreUnavailable",
    "artifact_id",
    "describe_directory",
    "fetch_artifact",
    "parse_location",
    "push_directory",
    "read_artifact",
]
