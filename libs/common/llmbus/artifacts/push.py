"""Publish a model directory as an artifact: every file with its sha256 and size, uploaded to the store.

    artifact = push_directory(Path("out/llama-8b-bf16"), "s3://models/llama-8b/3/bf16/", format="bf16")

The files go under the URI's prefix by their paths relative to the directory; beside them the
artifact itself (MANIFEST_NAME, its ModelArtifact as JSON) is written last, so a root with a
manifest has every file. A `file:///dir/` target is a directory on a shared file system: the files
are copied there (each written aside and renamed). The returned ModelArtifact is what a registry
record lists and what a worker fetches (llmbus.artifacts.fetch).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from llmbus.artifacts.location import MANIFEST_NAME, Location, parse_location
from llmbus.artifacts.store import ObjectStore, ObjectStoreError
from llmbus.contract.messages.artifacts import ArtifactFile, ModelArtifact
from llmbus.settings import MIB

HASH_CHUNK_BYTES = 4 * MIB


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def describe_directory(local_dir: Path) -> list[ArtifactFile]:
    """Every regular file under `local_dir` (hidden ones and an old manifest left out), by path."""
    if not local_dir.is_dir():
        raise FileNotFoundError(f"{local_dir}: not a directory")
    files = []
    for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(local_dir).as_posix()
        if relative == MANIFEST_NAME or any(part.startswith(".") for part in Path(relative).parts):
            continue
        files.append(ArtifactFile(path=relative, sha256=sha256_of(path), size_bytes=path.stat().st_size))
    if not files:
        raise FileNotFoundError(f"{local_dir}: no files to push")
    return files


def push_directory(
    local_dir: Path,
    uri: str,
    *,
    format: str,
    quantization: str | None = None,
    store: ObjectStore | None = None,
) -> ModelArtifact:
    """Upload (or copy) the directory's files to `uri` and return the artifact that lists them."""
    location = parse_location(uri)
    files = describe_directory(local_dir)
    artifact = ModelArtifact(format=format, quantization=quantization, uri=location.uri, files=files)
    manifest = artifact.model_dump_json(exclude_none=True, indent=2).encode()
    if location.scheme == "s3":
        store = store or ObjectStore()
        store.ensure_bucket(location.bucket)
        for file in files:
            stored = store.put_file(location.bucket, location.key(file.path), local_dir / file.path)
            if stored.size_bytes != file.size_bytes:  # the store kept something else than was sent
                raise ObjectStoreError(
                    f"s3://{location.bucket}/{location.key(file.path)}: stored {stored.size_bytes} bytes,"
                    f" sent {file.size_bytes}"
                )
        store.put_bytes(location.bucket, location.key(MANIFEST_NAME), manifest, content_type="application/json")
    else:
        _copy_into(local_dir, location, files, manifest)
    return artifact


def read_artifact(uri: str, store: ObjectStore | None = None) -> ModelArtifact:
    """The artifact whose root is `uri`, from the manifest `push_directory` wrote there."""
    location = parse_location(uri)
    if location.scheme == "s3":
        raw = (store or ObjectStore()).get_bytes(location.bucket, location.key(MANIFEST_NAME))
    else:
        raw = Path(location.key(MANIFEST_NAME)).read_bytes()
    return ModelArtifact.model_validate_json(raw)


def _copy_into(local_dir: Path, location: Location, files: list[ArtifactFile], manifest: bytes) -> None:
    target = Path(location.root)
    for file in files:
        source, final = local_dir / file.path, Path(location.key(file.path))
        if final.exists() and final.resolve() == source.resolve():
            continue  # the directory is its own target: describe it in place
        final.parent.mkdir(parents=True, exist_ok=True)
        aside = final.with_name(final.name + ".tmp")
        shutil.copyfile(source, aside)
        os.replace(aside, final)
    target.mkdir(parents=True, exist_ok=True)
    aside = target / (MANIFEST_NAME + ".tmp")
    aside.write_bytes(manifest)
    os.replace(aside, target / MANIFEST_NAME)
