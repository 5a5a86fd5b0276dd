"""`llmbus trace`'s lineage from decoded topic records: a retried request and a preempted one."""

from __future__ import annotations

from llmbus.contract.messages import (
    ChatMessage,
    ContinuedFrom,
    Dispatch,
    DispatchOutcome,
    ErrorCode,
    ErrorInfo,
    GpuInfo,
    InferenceRequest,
    InferenceResult,
    Leg,
    LegEnd,
    NodeProfile,
    OutcomeStatus,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
    Usage,
    WorkerState,
    WorkerStatus,
)
from llmbus.domain.lineage import Lineage, render

REQ = InferenceRequest(request_id="r1", tenant="acme", model="m", messages=[ChatMessage(role="user", content="hi")])
ROUTED = RoutedRequest(request=REQ, model="m", route_reason="rule:explicit")


def chunk(attempt: int, seq: int, delta: str, final: bool = False) -> TokenChunk:
    return TokenChunk(request_id="r1", tenant="acme", seq=seq, delta=delta, attempt=attempt, final=final)


def test_a_retried_request_shows_both_attempts_and_where_they_ran() -> None:
    lineage = Lineage("r1")
    records: list[object] = [
        REQ,
        ROUTED,
        Dispatch(routed=ROUTED, worker_id="w1", attempt=1),
        chunk(1, 0, "Hel"),
        DispatchOutcome(
            request_id="r1",
            worker_id="w1",
            attempt=1,
            status=OutcomeStatus.RETRYABLE,
            error=ErrorInfo.of(ErrorCode.WORKER_LOST, "heartbeat gap"),
        ),
        Dispatch(routed=ROUTED, worker_id="w2", attempt=2),
        chunk(2, 1, "lo"),
        chunk(2, 0, "Hel"),
        chunk(2, 2, "", final=True),
        DispatchOutcome(request_id="r1", worker_id="w2", attempt=2, status=OutcomeStatus.COMPLETED),
        InferenceResult(
            request_id="r1",
            tenant="acme",
            status=ResultStatus.OK,
            model="m",
            worker_id="w2",
            text="Hello",
            attempt=2,
            produced_by="engine-worker",
            node_id="n2",
            gpu="NVIDIA H200",
            model_version="7",
            model_format="fp8",
            preemptions=2,
            usage=Usage(prompt_tokens=10, completion_tokens=2, cached_prompt_tokens=8),
        ),
    ]
    for record in records:
        lineage.add(record)
    workers = {
        "w1": WorkerStatus(worker_id="w1", node_id="n1", state=WorkerState.READY, engine="sim", model_version="6")
    }
    nodes = {
        "n1": NodeProfile(
            node_id="n1",
            hostname="h1",
            kind="gpu",
            gpus=[
                GpuInfo(
                    index=0,
                    name="NVIDIA A100",
                    uuid="u",
                    memory_total_bytes=1,
                    memory_free_bytes=1,
                    compute_capability="8.0",
                )
            ],
        )
    }
    text = "\n".join(render(lineage, workers, nodes))
    assert "attempt 1: worker w1 on node n1 (NVIDIA A100), model version 6" in text
    assert "outcome: retryable worker_lost: heartbeat gap" in text
    assert "chunks: 1 (seq 0..0), 3 chars, no final chunk (abandoned)" in text
    assert "attempt 2: worker w2 on node n2 (NVIDIA H200), model version 7 format fp8" in text
    assert "chunks: 3 (seq 0..2), 5 chars, final" in text
    assert "cached prefix 8" in text and "preemptions 2" in text
    assert "result: ok by engine-worker (attempt 2)" in text and "WARNING" not in text


def test_a_request_never_seen_says_so() -> None:
    text = "\n".join(render(Lineage("nope")))
    assert "request not found" in text and "result: none yet" in text


def test_a_continued_answer_shows_each_leg() -> None:
    marker = ContinuedFrom(attempt=1, seq=1)
    legs = [
        Leg(attempt=1, worker_id="w1", model="m", first_seq=0, text_chars=3, prompt_tokens=5, completion_tokens=1),
        Leg(attempt=2, worker_id="w2", model="m", first_seq=1, text_chars=2, prompt_tokens=6, completion_tokens=1),
    ]
    legs[0].ended = LegEnd.WORKER_LOST
    lineage = Lineage("r1")
    for record in [
        REQ,
        ROUTED,
        Dispatch(routed=ROUTED, worker_id="w1", attempt=1),
        chunk(1, 0, "Hel"),
        Dispatch(routed=ROUTED, worker_id="w2", attempt=2),
        TokenChunk(request_id="r1", tenant="acme", seq=1, delta="lo", attempt=2, continues=marker),
        InferenceResult(request_id="r1", tenant="acme", status=ResultStatus.OK, text="Hello", attempt=2, legs=legs),
    ]:
        lineage.add(record)
    text = "\n".join(render(lineage))
    assert "continues attempt 1's answer from seq 1" in text
    assert (
        "leg 1: attempt 1, worker w1, model m, from seq 0, 3 chars; prompt 5 (cached 0), completion 1 tokens;" in text
    )
    assert "ended worker_lost" in text
    assert "leg 2: attempt 2, worker w2, model m, from seq 1, 2 chars; prompt 6 (cached 0), completion 1" in text
