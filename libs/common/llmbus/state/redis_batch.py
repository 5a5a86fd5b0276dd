"""Redis commands of concurrent callers sent together: one pipeline round trip for many.

Under load the services issue many small, independent Redis commands at once (a worker's
superseded checks, final claims and final marks of its concurrent attempts; a scheduler's
releases of finished placements). Each one alone is a socket write and a read, and the
profiles (bench/reports/pipeline_profile.md) show those syscalls as a large share of a
service's CPU. Here a call with nothing else at Redis is sent at once, by its caller; while
a round trip is under way new calls queue, and the next pipeline takes them all. There is
no timer, so a lone call is never delayed (the pattern of services/router/adapters/limits.py).

Nothing about a command changes: each keeps its own reply or error, scripts stay atomic
on their own, and the pipeline is not a transaction (no caller waits for another's
command). A script Redis does not know (restarted, cache flushed) is loaded and only the
commands refused for it are sent again: they never ran, so sending them again is safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import redis.asyncio as redis
from redis.exceptions import NoScriptError

# Puts exactly one command on a pipeline (or, given the client, returns that command's awaitable).
Queue = Callable[[Any], Any]
_Call = tuple[Queue, str | None, "asyncio.Future[Any]"]


class RedisBatcher:
    def __init__(self, client: redis.Redis, max_batch: int = 256) -> None:
        self._client = client
        self._max_batch = max_batch
        self._queue: list[_Call] = []
        self._busy_in: asyncio.AbstractEventLoop | None = None  # the loop whose round trip is under way
        self._flusher: asyncio.Task[None] | None = None
        self._sources: dict[str, str] = {}  # script sha → its source, to load it after a NOSCRIPT

    def script(self, source: str) -> Callable[[Sequence[str], Sequence[str | int | float]], Any]:
        """A Lua script run through the batch: `await run(keys, args)`."""
        sha = self._client.register_script(source).sha
        self._sources[sha] = source

        async def run(keys: Sequence[str], args: Sequence[str | int | float]) -> Any:
            # execute_command, not evalsha(): a cluster pipeline refuses the named method, yet routes
            # EVALSHA by its keys like any command (they share a slot: one node runs the script).
            return await self._call(lambda pipe: pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args), sha)

        return run

    async def call(self, queue: Queue) -> Any:
        """`queue` puts one command on the pipeline (e.g. `lambda p: p.get(key)`); returns its reply."""
        return await self._call(queue, None)

    async def _call(self, queue: Queue, sha: str | None) -> Any:
        loop = asyncio.get_running_loop()
        if self._busy_in is loop:  # a round trip is under way: join the next one
            future: asyncio.Future[Any] = loop.create_future()
            self._queue.append((queue, sha, future))
            return await future
        # Nothing at Redis: this call goes at once, in the caller's own task (no hop through a task).
        self._busy_in = loop
        try:
            return await self._alone(queue, sha)
        finally:
            self._busy_in = None
            if self._queue:  # calls that came meanwhile: one pipeline, sent by a task of its own
                self._busy_in = loop
                self._flusher = loop.create_task(self._flush())

    async def _alone(self, queue: Queue, sha: str | None) -> Any:
        """One command on the client itself: no pipeline to build for a single command."""
        try:
            return await queue(self._client)
        except NoScriptError:
            if sha is None:
                raise
            await self._client.script_load(self._sources[sha])
            return await queue(self._client)

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
                try:
                    await self._send(batch)
                except Exception as exc:  # noqa: BLE001 - the round trip failed: every waiting caller gets it
                    for _, _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
        finally:
            self._busy_in = None

    async def _send(self, batch: list[_Call]) -> None:
        replies = await self._execute(batch)
        again = [call for call, reply in zip(batch, replies, strict=True) if isinstance(reply, NoScriptError)]
        if again:
            for sha in {sha for _, sha, _ in again if sha is not None}:
                await self._client.script_load(self._sources[sha])
            settled = dict(zip(map(id, again), await self._execute(again), strict=True))
            replies = [settled.get(id(call), reply) for call, reply in zip(batch, replies, strict=True)]
        for (_, _, future), reply in zip(batch, replies, strict=True):
            if future.done():  # its caller gave up (cancelled, timed out)
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        pipe = self._client.pipeline(transaction=False)
        for queue, _, _ in batch:
            queue(pipe)
        return list(await pipe.execute(raise_on_error=False))
