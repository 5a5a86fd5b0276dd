"""The delivery audit (pure): what a namespace's topics say happened to every request sent.

For every request id sent it asks: exactly one final InferenceResult (non-shadow) per tenant that
used the id? Do the chunks of the attempt that produced each one form a gap-free seq 0..n with one
final chunk, last, whose text is the result's? Every result of an id is judged, not only the
first: another tenant's request of the same id is another request, with its own one result and
its own chunks. Answers (results with text) and errors (results with an error code) are counted
apart. It also checks every record against its topic (chunks only on reply topics, results only on
llm.results, ...) and, when asked, that every record on llm.requests (the shared topic and every
tenant's own) ended as a result or a DLQ entry with a reason. No broker imports: the reader
(`llmbus.audit.read`) turns a namespace into `Seen` records, tests build them by hand.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import ValidationError

from llmbus.contract import topics as t
from llmbus.contract.chunks import gaps, segments_of
from llmbus.contract.messages import ContinuedFrom, DeadLetter, InferenceResult, Message, ResultStatus, TokenChunk

SCHEMA_HEADER = "llmbus-schema"
MAX_EXAMPLES = 20  # problems listed by kind; the counts are always complete


@dataclass(frozen=True)
class Seen:
    """One record as read back from the broker (topic names carry the namespace prefix)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int | None = None  # the record's timestamp (its producer's clock)

    def header(self, name: str) -> str | None:
        for key, raw in self.headers:
            if key == name:
                return raw.decode(errors="replace")
        return None


@dataclass
class AuditReport:
    sent: int = 0
    answered: int = 0  # results with text: the request's one final result, OK
    errored: int = 0  # results with an error code: the request's one final result, an error
    lost: int = 0  # no final result
    doubled: int = 0  # more than one final result
    bad_chunks: int = 0  # the answering attempt's chunks are not a clean stream of the result's text
    misplaced: int = 0  # a record on a topic it does not belong on
    unaccounted: int = 0  # a record on llm.requests with neither a result nor a DLQ entry (when checked)
    error_results: dict[str, int] = field(default_factory=dict)  # error code → results with it
    errors_by_id: dict[str, str] = field(default_factory=dict)  # request id → the error code it ended with
    dead_letters: int = 0
    dead_letters_by: dict[str, int] = field(default_factory=dict)  # "<service>/<error code>" → letters
    chunk_redeliveries: int = 0  # identical copies of a chunk (dedupable by request id, attempt, seq)
    problems: dict[str, list[str]] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not (self.lost or self.doubled or self.bad_chunks or self.misplaced or self.unaccounted)

    def note(self, kind: str, detail: str) -> None:
        examples = self.problems.setdefault(kind, [])
        if len(examples) < MAX_EXAMPLES:
            examples.append(detail)

    def counts(self) -> dict[str, int]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "errored": self.errored,
            "lost": self.lost,
            "doubled": self.doubled,
            "bad_chunks": self.bad_chunks,
            "misplaced": self.misplaced,
            "unaccounted": self.unaccounted,
        }

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in self.counts().items())
        lines = [f"audit {'PASSED' if self.passed else 'FAILED'}: {counts}"]
        for kind, examples in self.problems.items():
            lines.append(f"  {kind}:")
            lines.extend(f"    {example}" for example in examples)
        return "\n".join(lines)


def is_request_topic(topics: t.Topics, topic: str) -> bool:
    """llm.requests, or a tenant's own request topic llm.requests.<tenant> (auth on)."""
    base = topic.removeprefix(topics.prefix)
    return base == t.REQUESTS or base.startswith(t.REQUESTS + ".")


def expected_type(topics: t.Topics, topic: str) -> type[Message]:
    """The message type a topic of the namespace carries; a topic outside the catalog is a reply topic."""
    base = topic.removeprefix(topics.prefix)
    if base.startswith((t.DISPATCH_PREFIX, t.FEEDBACK + ".")) or base in t.BY_NAME:
        return topics.spec_of(topic).value
    return TokenChunk


@dataclass
class _Decoded:
    results: dict[tuple[str, bool], list[InferenceResult]] = field(default_factory=lambda: defaultdict(list))
    # (request id, shadow) → attempt → [(topic, chunk)]
    chunks: dict[tuple[str, bool], dict[int, list[tuple[str, TokenChunk]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    letters: list[DeadLetter] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)


def _decode_all(topics: t.Topics, records: Iterable[Seen], report: AuditReport) -> _Decoded:
    decoded = _Decoded()
    for record in records:
        model = expected_type(topics, record.topic)
        where = f"{record.topic}[{record.partition}]@{record.offset}"
        if is_request_topic(topics, record.topic):
            decoded.requests.append(record)  # client input (tombstones too): judged by what became of it
            continue
        if record.value is None:
            spec_compacted = model is not TokenChunk and topics.spec_of(record.topic).compacted
            if not spec_compacted:
                report.misplaced += 1
                report.note("misplaced", f"{where}: tombstone on a topic that is not compacted")
            continue
        schema = record.header(SCHEMA_HEADER)
        if schema is not None and schema.split("/", 1)[0] != model.__name__:
            report.misplaced += 1
            report.note("misplaced", f"{where}: a {schema} on a topic of {model.__name__}")
            continue
        try:
            message = model.model_validate_json(record.value)
        except ValidationError as exc:
            report.misplaced += 1
            report.note("misplaced", f"{where}: not a {model.__name__}: {exc.errors()[0]['msg']}")
            continue
        if isinstance(message, InferenceResult):
            decoded.results[(message.request_id, message.shadow)].append(message)
        elif isinstance(message, TokenChunk):
            decoded.chunks[(message.request_id, message.shadow)][message.attempt].append((record.topic, message))
            if record.key is not None and record.key != message.request_id.encode():
                report.misplaced += 1
                report.note("misplaced", f"{where}: chunk of {message.request_id!r} keyed {record.key!r}")
        elif isinstance(message, DeadLetter):
            decoded.letters.append(message)
    return decoded


def _chunk_problem(
    result: InferenceResult, attempts: dict[int, list[tuple[str, TokenChunk]]], report: AuditReport
) -> str | None:
    """Why the chunks of the answer are not a clean stream of the result's text (None: they are). The answer
    is the answering attempt's chunks and, where it continues earlier attempts (`continues`), theirs up to
    where it cut them (docs/delivery.md, "Continuation across legs"): seq 0..n without a gap, the final chunk
    last (its attempt's), their text the result's."""
    later = sorted(a for a in attempts if a > result.attempt)
    if later:
        return f"chunks of attempt(s) {later} after the result of attempt {result.attempt}"
    stream = attempts.get(result.attempt, [])
    if not stream:
        return f"no chunks for attempt {result.attempt}"
    if len({topic for _, sent in attempts.items() for topic, _ in sent}) > 1:
        return f"chunks on several topics: {sorted({topic for sent in attempts.values() for topic, _ in sent})}"
    by_attempt: dict[int, dict[int, TokenChunk]] = {}
    continues: dict[int, ContinuedFrom] = {}
    for attempt, sent in attempts.items():
        by_seq = by_attempt.setdefault(attempt, {})
        for _, chunk in sent:
            known = by_seq.get(chunk.seq)
            if known is None:
                by_seq[chunk.seq] = chunk
            elif (known.delta, known.final) == (chunk.delta, chunk.final):
                report.chunk_redeliveries += 1
            else:
                return f"seq {chunk.seq} sent twice with different content (attempt {attempt})"
            marker = chunk.continues
            if marker is not None and continues.setdefault(attempt, marker) != marker:
                return f"attempt {attempt}'s chunks continue different attempts"
    own = by_attempt[result.attempt]
    finals = sorted(s for s, c in own.items() if c.final)
    if finals != [max(own)]:
        return f"final chunk(s) at seq {finals}, last seq {max(own)}"
    content = {a: [c for _, c in sorted(seqs.items()) if not c.final] for a, seqs in by_attempt.items()}
    segments = segments_of(content, continues, result.attempt)
    answer = [c for segment in segments for c in segment.chunks]
    if (gap := next(gaps(segments), None)) is not None:
        seqs = [c.seq for c in answer]
        missing = sorted(set(range(max(seqs) + 1)) - set(seqs))
        return f"seq gaps: missing {missing[:10]} ({gap})"
    if finals[0] != (answer[-1].seq + 1 if answer else finals[0]):
        return f"final chunk at seq {finals[0]}, the answer's last at {answer[-1].seq}"
    text = "".join(c.delta for c in answer)
    if text != result.text:
        return f"chunk text ({len(text)} chars) differs from the result's ({len(result.text)} chars)"
    return None


def request_id_of(raw: bytes) -> str | None:
    """The string `request_id` of a raw request record, if a JSON reader finds one."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    request_id = data.get("request_id") if isinstance(data, dict) else None
    return request_id if isinstance(request_id, str) else None


def audit(
    topics: t.Topics, records: Iterable[Seen], sent_ids: Iterable[str], *, account_requests: bool = False
) -> AuditReport:
    """Judge a run: `records` are everything read from the namespace, `sent_ids` the request ids sent.

    `account_requests`: also require that every record on llm.requests (hostile ones too) ended
    as a final result for its request id or as a DLQ entry that points at it, with a reason.
    """
    report = AuditReport()
    decoded = _decode_all(topics, records, report)
    report.dead_letters = len(decoded.letters)
    for letter in decoded.letters:
        by = f"{letter.service}/{letter.error_code}"
        report.dead_letters_by[by] = report.dead_letters_by.get(by, 0) + 1
    sent = list(dict.fromkeys(sent_ids))
    report.sent = len(sent)
    for request_id in sent:
        results = decoded.results.get((request_id, False), [])
        if not results:
            report.lost += 1
            report.note("lost", request_id)
            continue
        # One result per (tenant, request id): another tenant's request of the same id (a foreign
        # copy) is another request, with its own one result; two of one tenant are doubled.
        by_tenant: dict[str, list[InferenceResult]] = defaultdict(list)
        for r in results:
            by_tenant[r.tenant].append(r)
        if any(len(same) > 1 for same in by_tenant.values()):
            report.doubled += 1
            report.note(
                "doubled",
                f"{request_id}: {len(results)} results "
                + ", ".join(f"{r.tenant}/{r.produced_by}/attempt {r.attempt}/{r.status.value}" for r in results),
            )
            continue
        for result in results:  # each tenant's one result: every one is judged
            _judge(report, request_id, result, decoded)
    for (request_id, shadow), results in decoded.results.items():
        if shadow and len(results) > 1:
            report.doubled += 1
            report.note("doubled", f"{request_id} (shadow): {len(results)} results")
    if account_requests:
        _account_requests(topics, decoded, report)
    return report


def _judge(report: AuditReport, request_id: str, result: InferenceResult, decoded: _Decoded) -> None:
    """One request's one final result: an answer or an error (by code), and its attempt's chunks."""
    if result.status == ResultStatus.OK:
        report.answered += 1
    else:
        code = result.error.code.value if result.error else "unknown"
        report.errored += 1
        report.error_results[code] = report.error_results.get(code, 0) + 1
        report.errors_by_id[request_id] = code
    problem = _chunk_problem(result, _of_tenant(decoded.chunks.get((request_id, False), {}), result.tenant), report)
    if problem is not None:
        report.bad_chunks += 1
        report.note("bad_chunks", f"{request_id}: {problem} (tenant {result.tenant})")


def _of_tenant(chunks: dict[int, list[tuple[str, TokenChunk]]], tenant: str) -> dict[int, list[tuple[str, TokenChunk]]]:
    """The chunks of one tenant's request (another tenant may use the same request id)."""
    mine = {n: [(topic, c) for topic, c in sent if c.tenant == tenant] for n, sent in chunks.items()}
    return {n: sent for n, sent in mine.items() if sent}


def _account_requests(topics: t.Topics, decoded: _Decoded, report: AuditReport) -> None:
    answered = {request_id for (request_id, shadow) in decoded.results if not shadow}
    lettered = {
        (d.source_topic, d.source_partition, d.source_offset) for d in decoded.letters if d.error and d.error_code
    }
    for record in decoded.requests:
        if (record.topic, record.partition, record.offset) in lettered:
            continue
        request_id = request_id_of(record.value or b"")
        if request_id is not None and request_id in answered:
            continue
        report.unaccounted += 1
        report.note(
            "unaccounted",
            f"{record.topic}[{record.partition}]@{record.offset} (request id {request_id!r:.80}): "
            "neither a result nor a DLQ entry",
        )
