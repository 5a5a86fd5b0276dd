"""The delivery audit on crafted logs: clean runs pass, every kind of loss, doubling and misfiling is flagged."""

from __future__ import annotations

import base64
import itertools
import json

from llmbus.audit import Seen, audit
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    ContinuedFrom,
    DeadLetter,
    Dispatch,
    ErrorCode,
    ErrorInfo,
    FinishReason,
    InferenceRequest,
    InferenceResult,
    Message,
    ResultStatus,
    RoutedRequest,
    TokenChunk,
)

TOPICS = t.Topics("t0123456789.")
_offsets = itertools.count()


def rec(base: str, message: Message | bytes | None, key: str | None = None, schema: str | None = None) -> Seen:
    value = message.to_bytes() if isinstance(message, Message) else message
    name = schema or (message.schema_name() if isinstance(message, Message) else None)
    headers = (("llmbus-schema", name.encode()),) if name else ()
    return Seen(TOPICS.name(base), 0, next(_offsets), key.encode() if key else None, value, headers)


def chunks(request_id: str, text_parts: list[str], attempt: int = 1, topic: str = t.TOKENS) -> list[Seen]:
    out = [
        rec(topic, TokenChunk(request_id=request_id, tenant="a", seq=i, delta=part, attempt=attempt), request_id)
        for i, part in enumerate(text_parts)
    ]
    final = TokenChunk(
        request_id=request_id,
        tenant="a",
        seq=len(text_parts),
        final=True,
        finish_reason=FinishReason.STOP,
        attempt=attempt,
    )
    return [*out, rec(topic, final, request_id)]


def result(request_id: str, text: str, attempt: int = 1, **fields: object) -> Seen:
    value = InferenceResult(
        request_id=request_id, tenant="a", status=ResultStatus.OK, text=text, attempt=attempt, **fields
    )  # type: ignore[arg-type]
    return rec(t.RESULTS, value, request_id)


def answered(request_id: str, parts: list[str], attempt: int = 1) -> list[Seen]:
    return [*chunks(request_id, parts, attempt), result(request_id, "".join(parts), attempt)]


def test_clean_run_passes_with_counts() -> None:
    log = answered("r1", [" a", " b"]) + answered("r2", [" c"])
    report = audit(TOPICS, log, ["r1", "r2"])
    assert report.passed, report.summary()
    assert report.counts() == {
        "sent": 2,
        "answered": 2,
        "errored": 0,
        "lost": 0,
        "doubled": 0,
        "bad_chunks": 0,
        "misplaced": 0,
        "unaccounted": 0,
    }


def test_request_without_result_is_lost() -> None:
    report = audit(TOPICS, answered("r1", [" a"]) + chunks("r2", [" b"]), ["r1", "r2"])
    assert not report.passed and report.lost == 1 and report.problems["lost"] == ["r2"]


def test_two_results_are_doubled_even_when_identical() -> None:
    log = [*answered("r1", [" a"]), result("r1", " a")]
    report = audit(TOPICS, log, ["r1"])
    assert report.doubled == 1 and report.answered == 0 and not report.passed


def test_an_error_result_is_the_requests_one_result_counted_apart_from_answers() -> None:
    error = InferenceResult(
        request_id="r1",
        tenant="a",
        status=ResultStatus.ERROR,
        error=ErrorInfo.of(ErrorCode.QUEUE_FULL, "full"),
        finish_reason=FinishReason.ERROR,
    )
    log = [*chunks("r1", []), rec(t.RESULTS, error, "r1")]
    report = audit(TOPICS, log, ["r1"])
    assert report.passed, report.summary()
    assert (report.answered, report.errored) == (0, 1)
    assert report.error_results == {"queue_full": 1} and report.errors_by_id == {"r1": "queue_full"}


def test_every_tenants_result_of_an_id_is_judged_not_only_the_first() -> None:
    """Two tenants' requests of one id: two requests. The second one's chunks are checked too."""
    first = answered("r1", [" a"])
    other = InferenceResult(request_id="r1", tenant="b", status=ResultStatus.OK, text=" z", attempt=1)
    gap = rec(t.TOKENS, TokenChunk(request_id="r1", tenant="b", seq=1, delta=" z", final=True, attempt=1), "r1")
    report = audit(TOPICS, [*first, gap, rec(t.RESULTS, other, "r1")], ["r1"])
    assert report.answered == 2 and report.bad_chunks == 1, report.summary()
    assert "tenant b" in report.problems["bad_chunks"][0]


def test_seq_gap_and_missing_final_are_bad_chunks() -> None:
    gap = [c for i, c in enumerate(chunks("r1", [" a", " b", " c"])) if i != 1] + [result("r1", " a b c")]
    no_final = [*chunks("r2", [" a"])[:-1], result("r2", " a")]
    report = audit(TOPICS, gap + no_final, ["r1", "r2"])
    assert report.bad_chunks == 2, report.summary()
    assert any("missing [1]" in p for p in report.problems["bad_chunks"])
    assert any("final" in p for p in report.problems["bad_chunks"])


def test_text_differing_from_result_is_bad_chunks() -> None:
    log = [*chunks("r1", [" a", " b"]), result("r1", " a b c")]
    report = audit(TOPICS, log, ["r1"])
    assert report.bad_chunks == 1 and "differs" in report.problems["bad_chunks"][0]


def test_only_the_answering_attempt_counts_and_a_later_attempt_is_flagged() -> None:
    # attempt 1 streamed half and was abandoned; attempt 2 answered: clean.
    retried = chunks("r1", [" x"], attempt=1)[:-1] + answered("r1", [" a", " b"], attempt=2)
    # attempt 2 streamed after attempt 1's result (a zombie's twin): a client keeping the newest attempt is misled.
    zombie = answered("r2", [" a"], attempt=1) + chunks("r2", [" z"], attempt=2)[:-1]
    report = audit(TOPICS, retried + zombie, ["r1", "r2"])
    assert report.answered == 2 and report.bad_chunks == 1, report.summary()
    assert report.problems["bad_chunks"][0].startswith("r2: chunks of attempt(s) [2]")


def test_identical_redelivered_chunk_is_tolerated_but_conflicting_one_is_not() -> None:
    same = answered("r1", [" a", " b"])
    same.insert(1, same[0])
    conflicting = answered("r2", [" a", " b"])
    conflicting.insert(1, rec(t.TOKENS, TokenChunk(request_id="r2", tenant="a", seq=0, delta=" q"), "r2"))
    report = audit(TOPICS, same + conflicting, ["r1", "r2"])
    assert report.chunk_redeliveries == 1
    assert report.bad_chunks == 1 and "r2: seq 0 sent twice" in report.problems["bad_chunks"][0]


def test_shadow_results_do_not_answer_the_primary_and_may_not_double() -> None:
    shadow = InferenceResult(request_id="r1", tenant="a", status=ResultStatus.OK, shadow=True)
    log = [rec(t.RESULTS, shadow, "r1"), rec(t.RESULTS, shadow, "r1")]
    report = audit(TOPICS, log, ["r1"])
    assert report.lost == 1 and report.doubled == 1


def test_records_on_the_wrong_topic_are_misplaced() -> None:
    r = InferenceResult(request_id="r1", tenant="a", status=ResultStatus.OK, text=" a")
    chunk = TokenChunk(request_id="r1", tenant="a", seq=0, delta=" a")
    routed = RoutedRequest(request=InferenceRequest(request_id="r1", prompt="p"), model="m")
    log = [
        *answered("r1", [" a"]),
        rec(t.TOKENS, r, "r1"),  # a result on the reply topic
        rec(t.RESULTS, chunk, "r1"),  # a chunk on llm.results
        rec(t.OUTCOMES, Dispatch(routed=routed, worker_id="w"), "r1"),  # a dispatch on llm.outcomes
        rec(t.DISPATCH_PREFIX + "w1", chunk, "r1", schema="Dispatch/1"),  # shape gives it away, not the header
        rec(t.RESULTS, None, "r1"),  # a tombstone on a log topic
        rec(t.TOKENS, chunk, "someone-else"),  # a chunk keyed by another request id
    ]
    report = audit(TOPICS, log, ["r1"])
    assert report.misplaced == 6, report.summary()
    assert report.answered == 1


def test_chunks_on_a_private_reply_topic_are_fine() -> None:
    log = [*chunks("r1", [" a"], topic="llm.tokens.acme"), result("r1", " a")]
    assert audit(TOPICS, log, ["r1"]).passed


def test_every_request_record_ends_as_result_or_dead_letter() -> None:
    good = rec(t.REQUESTS, InferenceRequest(request_id="r1", prompt="p"), "r1")
    garbage = rec(t.REQUESTS, b"\xff{not json", "g")
    lettered_garbage = rec(t.REQUESTS, b"[]", "h")
    no_trace = rec(t.REQUESTS, json.dumps({"request_id": "r9", "prompt": 5}).encode(), "r9")
    letter = DeadLetter(
        source_topic=lettered_garbage.topic,
        source_partition=0,
        source_offset=lettered_garbage.offset,
        raw_value_b64=base64.b64encode(b"[]").decode(),
        error_code="malformed",
        error="expected a JSON object",
        service="router",
    )
    log = [good, garbage, lettered_garbage, no_trace, *answered("r1", [" a"]), rec(t.DLQ, letter)]
    report = audit(TOPICS, log, ["r1"], account_requests=True)
    assert report.unaccounted == 2 and report.dead_letters == 1, report.summary()
    assert audit(TOPICS, log, ["r1"]).passed  # not asked: only the sent ids are judged


def test_a_tombstone_on_llm_requests_is_client_input_accounted_by_its_dead_letter() -> None:
    tombstone = rec(t.REQUESTS, None, "k")
    letter = DeadLetter(
        source_topic=tombstone.topic,
        source_partition=0,
        source_offset=tombstone.offset,
        raw_value_b64="",
        error_code="malformed",
        error="empty value (tombstone) where a message was expected",
        service="router",
    )
    report = audit(TOPICS, [tombstone, rec(t.DLQ, letter)], [], account_requests=True)
    assert report.passed, report.summary()
    assert audit(TOPICS, [tombstone], [], account_requests=True).unaccounted == 1


def continued(request_id: str, first: list[str], rest: list[str], cut: int | None = None) -> list[Seen]:
    """Attempt 1 streams `first` and dies; attempt 2 continues it from `cut` (default: all of it)."""
    cut = len(first) if cut is None else cut
    marker = ContinuedFrom(attempt=1, seq=cut)
    out = chunks(request_id, first)[:-1]
    for i, part in enumerate([*rest, ""]):
        chunk = TokenChunk(
            request_id=request_id,
            tenant="a",
            seq=cut + i,
            delta=part,
            attempt=2,
            continues=marker,
            final=i == len(rest),
        )
        out.append(rec(t.TOKENS, chunk, request_id))
    return out


def test_a_continued_answer_is_one_clean_stream_across_its_attempts() -> None:
    log = [*continued("r1", [" a", " b"], [" c"]), result("r1", " a b c", attempt=2)]
    # a zombie's chunk past the cut is no part of the answer
    zombie = [*continued("r2", [" a", " b", " z"], [" c"], cut=2), result("r2", " a b c", attempt=2)]
    report = audit(TOPICS, log + zombie, ["r1", "r2"])
    assert report.passed and report.bad_chunks == 0, report.summary()


def test_a_continuation_that_repeats_or_loses_text_is_bad_chunks() -> None:
    repeated = [*continued("r1", [" a", " b"], [" b", " c"]), result("r1", " a b c", attempt=2)]
    lost = [*continued("r2", [" a", " b"], [" c"], cut=3), result("r2", " a b c", attempt=2)]  # seq 2 never sent
    report = audit(TOPICS, repeated + lost, ["r1", "r2"])
    assert report.bad_chunks == 2, report.summary()
    assert any("differs" in p for p in report.problems["bad_chunks"])
    assert any("missing [2]" in p for p in report.problems["bad_chunks"])
