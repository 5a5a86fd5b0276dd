"""A job run every `interval_s` for the life of a process: heartbeats, timers, sweeps, samples; and a
job with no stop of its own turned into a task that the stop cancels (`cancelled_at_stop`).

A run that fails is logged and the next one comes on time: a Redis or Kafka hiccup must not end a
loop that nothing restarts. The wait is on the stop event, so a stop ends it at once, mid-interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

Job = Callable[[], Awaitable[object]]


async def run_every(
    interval_s: float,
    job: Job,
    *,
    name: str,
    stop: asyncio.Event | None = None,
    at_once: bool = False,
) -> None:
    """`job` every `interval_s` until `stop` is set or the task is cancelled; `at_once`: the first run
    before the first wait."""
    stop = stop if stop is not None else asyncio.Event()
    if at_once:
        await _run(job, name)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            pass
        await _run(job, name)


async def _run(job: Job, name: str) -> None:
    try:
        await job()
    except Exception:
        log.warning("%s failed; it runs again at the next interval", name, exc_info=True)


def cancelled_at_stop(
    job: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[asyncio.Event], Coroutine[Any, Any, None]]:
    """A task for a job that knows no stop of its own (a loop waiting on an event): cancelled at the stop."""

    async def task(stop: asyncio.Event) -> None:
        running = asyncio.create_task(job())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not running.done():
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        if not running.cancelled():
            running.result()

    return task
