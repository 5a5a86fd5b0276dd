"""`python -m tests.integration.router_killed_after_answer`: the router, SIGKILLed at the one point its own
answers are exposed: after it published an answer (a cache hit, a refusal) and before it marked the
request's final marker done. tests/integration/test_router_answer_after_crash.py runs it."""

from __future__ import annotations

import os
import signal

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus.contract.request_key import RequestKey
from llmbus.state.fencing import RequestFence
from llmbus_services.router.app import main
from llmbus_services.router.flows.requests import ROUTER_ATTEMPT

_marked = RequestFence.final_published


async def _killed_before_marking(self: RequestFence, key: RequestKey, attempt: int) -> None:
    if attempt == ROUTER_ATTEMPT:
        os.kill(os.getpid(), signal.SIGKILL)
    await _marked(self, key, attempt)


if __name__ == "__main__":
    RequestFence.final_published = _killed_before_marking  # type: ignore[method-assign]
    run_service(t.ROUTER, main)
