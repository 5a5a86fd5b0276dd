"""cost-accounting that stops dead at one point of its first batch, so a test can SIGKILL it there.

`python -m tests.integration.cost_crash_service` with LLMBUS_TEST_CRASH_AT:
  staged     after a batch's CostRecords are in the outbox, before they are published: the next
             run publishes and applies them from there; the results come again and are skipped;
  published  after a batch's CostRecords are on llm.costs, before they are applied (and their
             results marked seen): the next run publishes the staged copies again and applies them;
  applied    after a batch is applied (markers, seen markers, increments, outbox cleared: one
             script), before the consumer commits it: the batch comes again and is skipped.
It writes LLMBUS_TEST_CRASH_FLAG once it has stopped there. Not a test: a process for one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.cost_accounting.adapters.publishing import CostPublisher
from llmbus_services.cost_accounting.adapters.store import CostStore
from llmbus_services.cost_accounting.app import main


def stop_dead_after(cls: type, name: str, flag: Path) -> None:
    real: Callable[..., Awaitable[Any]] = getattr(cls, name)

    async def then_hang(self: object, *args: object, **kwargs: object) -> Any:
        out = await real(self, *args, **kwargs)
        await asyncio.to_thread(flag.write_text, name)
        await asyncio.Event().wait()  # never returns: the test kills the process here
        return out

    setattr(cls, name, then_hang)


if __name__ == "__main__":
    flag = Path(os.environ["LLMBUS_TEST_CRASH_FLAG"])
    where = os.environ["LLMBUS_TEST_CRASH_AT"]
    if where == "staged":
        stop_dead_after(CostStore, "stage", flag)
    elif where == "published":
        stop_dead_after(CostPublisher, "publish_records", flag)
    else:
        stop_dead_after(CostStore, "bill", flag)
    run_service(t.COST, main)
