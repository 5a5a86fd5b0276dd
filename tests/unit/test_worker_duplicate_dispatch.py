"""A Dispatch delivered twice at once (a restarted scheduler re-sent it) runs once on a worker (issue 9).

The `running` check and the claim used to be separated by awaits (the superseded check in Redis),
so two copies handled concurrently both passed it and the engine ran the request twice.
"""

from __future__ import annotations

import asyncio

from llmbus.contract.messages import DispatchOutcome, InferenceResult, TokenChunk
from tests.unit.test_worker_request_errors import MemoryFence, ScriptedEngine, record, worker


class SlowFence(MemoryFence):
    """Redis answers after a round trip: every check yields to the event loop."""

    async def superseded(self, request_id: str, attempt: int) -> bool:
        await asyncio.sleep(0)
        return await super().superseded(request_id, attempt)


async def test_two_copies_of_one_dispatch_handled_concurrently_run_the_engine_once() -> None:
    engine = ScriptedEngine(tokens=3)
    handlers, publisher = worker(engine, SlowFence())
    await asyncio.gather(handlers.on_dispatch(record()), handlers.on_dispatch(record()))
    assert engine.calls == 1
    [result] = publisher.of(InferenceResult)
    chunks = [c for c in publisher.of(TokenChunk) if c.attempt == result.attempt]
    assert [c.seq for c in chunks] == list(range(len(chunks)))  # one gap-free stream, not two interleaved
    assert not handlers.running  # the claim is released when the run ends


async def test_a_copy_arriving_after_the_run_ended_is_judged_by_the_fence() -> None:
    engine = ScriptedEngine(tokens=2)
    handlers, publisher = worker(engine, SlowFence())
    await handlers.on_dispatch(record())
    await handlers.on_dispatch(record())  # finished already: the final marker says done
    assert engine.calls == 1 and len(publisher.of(InferenceResult)) == 1
    assert publisher.of(DispatchOutcome)[-1].status.value == "duplicate"


class MarkerDown(MemoryFence):
    """Redis goes away between the claim and the `done` mark (seen under load: a pool timeout)."""

    claim_lease_ms = 300

    async def final_published(self, request_id: str, attempt: int) -> None:
        raise TimeoutError("no connection available")


async def test_a_failure_after_the_result_is_out_never_sends_the_request_round_again() -> None:
    handlers, publisher = worker(ScriptedEngine(tokens=2), MarkerDown())
    await handlers.on_dispatch(record())  # logged, not raised: the record is done
    [result] = publisher.of(InferenceResult)  # no second, error result from _answer_failure
    assert result.status.value == "ok"
    statuses = [o.status.value for o in publisher.of(DispatchOutcome)]
    assert "retryable" not in statuses  # a retry would publish a second result once the lease ran out


async def test_a_later_attempt_arriving_while_the_earlier_runs_here_is_handed_back_not_dropped() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def step(i: int) -> None:
        started.set()
        await release.wait()

    handlers, publisher = worker(ScriptedEngine(tokens=2, on_step=step), SlowFence())
    first = asyncio.create_task(handlers.on_dispatch(record(attempt=1)))
    await started.wait()
    await handlers.on_dispatch(record(attempt=2))  # the worker looked dead; now it is back
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.attempt == 2 and outcome.status.value == "retryable"  # placed again, never silently lost
    release.set()
    await first
