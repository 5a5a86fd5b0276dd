"""File locks (flock) between the processes of one node: the kernel drops a dead process's locks, so a
worker killed mid-download or while serving never leaves a lock (or a lease) behind.

A lock file may be removed by whoever holds it exclusively (the cache removes an evicted artifact's
lease file): a process that opened the old file before it was removed and then got the lock would hold
a lock on nothing, so `hold` checks after locking that the path still names the file it locked, and
opens it again if not. flock needs a local file system (not NFS): one cache per node, on local disk.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


class LockTimeout(TimeoutError):
    pass


class FileLock:
    """A held flock; `release` (or leaving the `with`) gives it up. Forked children share it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the lock
            self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def __enter__(self) -> FileLock:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def try_hold(path: Path, *, exclusive: bool) -> FileLock | None:
    """The lock at once, or None when another process holds it in a conflicting mode."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _still_named(path, fd):
            return FileLock(path, fd)
        os.close(fd)  # removed (and maybe made again) between our open and our lock: try the current one


def hold(path: Path, *, exclusive: bool, timeout_s: float | None = None, poll_s: float = 0.1) -> FileLock:
    """Wait for the lock (at most `timeout_s`, then LockTimeout)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        lock = try_hold(path, exclusive=exclusive)
        if lock is not None:
            return lock
        if deadline is not None and time.monotonic() >= deadline:
            raise LockTimeout(f"{path}: still locked by another process after {timeout_s:.0f}s")
        time.sleep(poll_s)


def _still_named(path: Path, fd: int) -> bool:
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
