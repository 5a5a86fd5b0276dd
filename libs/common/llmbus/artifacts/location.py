"""Where an artifact lives: `s3://<bucket>/<prefix>/` in an object store or `file:///<dir>/` on a file system."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

# Beside an artifact's files, the artifact itself (its ModelArtifact as JSON): `push` writes it, and a
# worker pointed at an artifact's root (not at a registry record) reads it. Never one of the files.
MANIFEST_NAME = "llmbus-artifact.json"


@dataclass(frozen=True)
class Location:
    scheme: str  # "s3" | "file"
    bucket: str  # s3 only
    root: str  # s3: the key prefix, "" or ending in "/"; file: the absolute directory

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.root}" if self.scheme == "s3" else f"file://{self.root.rstrip('/')}/"

    def key(self, path: str) -> str:
        """The object key (s3) or absolute file path (file) of a file of the artifact."""
        relative = safe_relative(path)
        return f"{self.root}{relative}" if self.scheme == "s3" else str(Path(self.root) / relative)


def parse_location(uri: str) -> Location:
    """`s3://bucket/prefix/` or `file:///abs/dir/`; ValueError for anything else."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"{uri!r}: an s3 URI names its bucket (s3://<bucket>/<prefix>/)")
        prefix = parts.path.lstrip("/")
        return Location("s3", parts.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise ValueError(f"{uri!r}: a file URI names an absolute directory (file:///<dir>/)")
        return Location("file", "", parts.path)
    raise ValueError(f"{uri!r}: an artifact lives at s3://<bucket>/<prefix>/ or file:///<dir>/")


def safe_relative(path: str) -> str:
    """A file's path inside its artifact: relative, '/'-separated, never leaving the artifact's root."""
    pure = PurePosixPath(path)
    if pure.is_absolute() or not pure.parts or any(part in ("..", ".", "") for part in pure.parts):
        raise ValueError(f"{path!r}: an artifact's file path is relative and stays inside the artifact")
    return str(pure)
