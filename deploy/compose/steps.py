"""Timed steps of the compose scripts (stack.py): each prints its name and duration, a failure says why."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

TIMINGS: list[tuple[str, float]] = []


class StepFailed(RuntimeError):
    pass


def say(text: str) -> None:
    print(text, flush=True)


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    say(f"==> {name}")
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    TIMINGS.append((name, took))
    say(f"    ok in {took:.1f} s")


def run(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout_s: float = 600, check: bool = True, show: bool = False
) -> str:
    """The command's output; `show`: passed through as it comes (long steps show their progress)."""
    capture = None if show else subprocess.PIPE
    done = subprocess.run(
        cmd,
        env=env,
        stdout=capture,
        stderr=capture,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        output = f"{(done.stdout or '')[-3000:]}{(done.stderr or '')[-3000:]}"
        raise StepFailed(f"{' '.join(cmd[:6])} … exited {done.returncode}:\n{output}")
    return done.stdout or ""


def wait_for(
    what: str, ready: Callable[[], bool], timeout_s: float, fail: Callable[[], str | None] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        if reason := fail():
            raise StepFailed(f"{what}: {reason}")
        time.sleep(1.0)
    raise StepFailed(f"{what}: not after {timeout_s:.0f} s")


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def metric_text(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def report() -> None:
    total = sum(took for _, took in TIMINGS)
    say("\nstep timings (s):")
    for name, took in TIMINGS:
        say(f"  {took:7.1f}  {name}")
    say(f"  {total:7.1f}  total")
