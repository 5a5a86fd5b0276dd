"""A zero-cost OpenAI-compatible upstream in its own process (the test fixture's server), for benchmarks.

    python -m bench.openai_upstream   # port from LLMBUS_BENCH_UPSTREAM_PORT; model "det" streams " w0 w1 ..."

Run apart from the benchmark's clients so its CPU is its own, measured and reported apart
from the control plane's.
"""

from __future__ import annotations

import asyncio
import os
import signal

from llmbus_tools.harness.openai_server import FakeOpenAIServer


class _Forgetful(FakeOpenAIServer):
    """The fixture keeps every request for asserts; a long benchmark must not."""

    def __post_init__(self) -> None:
        self.seen = _Discard()


class _Discard(list):  # type: ignore[type-arg]
    def append(self, item: object) -> None:
        pass


async def main() -> None:
    server = _Forgetful(port=int(os.environ.get("LLMBUS_BENCH_UPSTREAM_PORT", "0")))
    await server.start()
    print(f"upstream on {server.base_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
