"""Durable file steps the archive's commit protocols are built from: fsynced writes, fsynced renames."""

from __future__ import annotations

import os
from pathlib import Path

from llmbus.archive.layout import TMP_SUFFIX


def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + TMP_SUFFIX)


def write_durably(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_durably(path: Path, data: bytes) -> None:
    """`data` at `path` whole or not at all: written as `.tmp`, fsynced, renamed, the directory fsynced."""
    write_durably(tmp_path(path), data)
    os.replace(tmp_path(path), path)
    fsync_dir(path.parent)
