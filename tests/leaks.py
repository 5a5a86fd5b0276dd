"""Servers a test session started and left running: a redis-server or broker JVM whose working
directory or command line lies under the session's temporary directory (private instances keep their
data there; redis-server changes into its --dir). The shared ones (6379, 9092) live elsewhere."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import psutil

SERVER_NAMES = frozenset({"redis-server", "java"})


def leftovers(root: Path, names: Iterable[str] = SERVER_NAMES) -> list[psutil.Process]:
    """Live processes named one of `names` whose cwd or command line mentions `root`."""
    wanted, under = set(names), str(root).rstrip("/")
    found: list[psutil.Process] = []
    for proc in psutil.process_iter(["name", "cwd", "cmdline", "status"]):
        info = proc.info
        if info["name"] not in wanted or info["status"] == psutil.STATUS_ZOMBIE:
            continue
        # With the separator: /tmp/pytest-of-root/pytest-18 is not /tmp/pytest-of-root/pytest-185.
        if any(place == under or under + "/" in place for place in [info["cwd"] or "", *(info["cmdline"] or [])]):
            found.append(proc)
    return found


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} {proc.name()} in {proc.cwd()}: {' '.join(proc.cmdline())[:200]}"
    except psutil.Error:
        return f"pid {proc.pid}"
