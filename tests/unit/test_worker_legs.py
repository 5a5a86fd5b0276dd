"""An engine that continues an answer in its own process (LegCut(in_process=True): a hosted upstream cut, the
next deployment or model goes on), and one that cannot (handed back): the worker's side of the seam
(flows/answer.py), with the fakes of test_worker_request_errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

from llmbus.contract.messages import (
    Continuation,
    DispatchOutcome,
    ErrorCode,
    InferenceResult,
    LegEnd,
    OutcomeStatus,
    ResultStatus,
    TokenChunk,
)
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest, LegCut
from tests.unit.test_worker_request_errors import ScriptedEngine, record, worker


class FailingOver(ScriptedEngine):
    """Each run streams `per_leg[n]` tokens from upstream `up-<n>`; every run but the last ends cut."""

    def __init__(self, per_leg: list[int], in_process: bool = True) -> None:
        super().__init__()
        self.per_leg, self.in_process = per_leg, in_process
        self.seen: list[EngineRequest] = []

    def can_continue(self, request: EngineRequest) -> bool:
        return True

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        leg = len(self.seen)
        self.seen.append(request)
        model = f"up-{leg}"
        for i in range(self.per_leg[leg]):
            yield EngineOutput(f" w{leg}.{i}", 1, 5, i + 1, model=model, deployment=f"d{leg}")
        if leg + 1 < len(self.per_leg):
            raise LegCut("upstream cut mid-answer", in_process=self.in_process, model=model)
        yield EngineOutput("", 0, 5, self.per_leg[leg], finished=True, finish_reason="stop", model=model)


async def test_an_engine_goes_on_in_process_and_the_result_records_each_leg() -> None:
    engine = FailingOver([3, 2])
    handlers, publisher = worker(engine)
    await handlers.on_dispatch(record())
    [result] = publisher.of(InferenceResult)
    chunks = publisher.of(TokenChunk)
    assert result.status == ResultStatus.OK and result.text == " w0.0 w0.1 w0.2 w1.0 w1.1"
    assert [c.seq for c in chunks] == list(range(len(chunks))) and {c.attempt for c in chunks} == {1}
    assert all(c.continues is None for c in chunks)  # one attempt: its seqs simply go on
    second: Continuation | None = engine.seen[1].continuation
    assert second is not None and second.text == " w0.0 w0.1 w0.2" and second.completion_tokens == 3
    assert engine.seen[1].max_tokens == engine.seen[0].max_tokens - 3  # what is left of the request's
    assert second.next_seq == 3 and [leg.ended for leg in second.legs] == [LegEnd.UPSTREAM_FAILED]
    assert result.legs is not None
    assert [(leg.model, leg.deployment, leg.completion_tokens, leg.first_seq, leg.ended) for leg in result.legs] == [
        ("up-0", "d0", 3, 0, LegEnd.UPSTREAM_FAILED),
        ("up-1", "d1", 2, 3, LegEnd.COMPLETED),
    ]
    assert result.usage.completion_tokens == 5 == sum(c.tokens for c in chunks)
    assert result.legs[1].prompt_tokens == 5  # as the engine read it (a fake's count)


async def test_past_the_migration_limit_an_in_process_cut_ends_the_answer() -> None:
    engine = FailingOver([2, 2, 2])
    handlers, publisher = worker(engine, migration_limit=2)
    await handlers.on_dispatch(record())
    [result] = publisher.of(InferenceResult)
    assert result.status == ResultStatus.ERROR and result.error is not None
    assert result.error.code == ErrorCode.MIGRATION_LIMIT and result.text == " w0.0 w0.1 w1.0 w1.1"
    assert len(engine.seen) == 2 and result.legs is not None and len(result.legs) == 2


async def test_a_cut_the_engine_cannot_go_on_from_is_handed_back_with_its_chunks_out() -> None:
    engine = FailingOver([2, 2], in_process=False)
    handlers, publisher = worker(engine)
    await handlers.on_dispatch(record())
    assert publisher.of(InferenceResult) == [] and len(engine.seen) == 1
    [outcome] = publisher.of(DispatchOutcome)
    assert outcome.status == OutcomeStatus.RETRYABLE and outcome.error is not None
    assert "".join(c.delta for c in publisher.of(TokenChunk)) == " w0.0 w0.1"  # all of it flushed
