"""Hostile input for llm.requests, drawn with Hypothesis: sizes around every limit, deep nesting,
lone surrogates, CR/LF and very long request ids, huge seeds, many stop strings, reply topics
that are internal or outside the namespace, duplicated and foreign request ids, and plain garbage.

Each record is raw bytes as an outside client could write them. `request_id` is the id a
reader of the JSON finds (a string field `request_id`), or None: with an id, the client must get
exactly one final result; without one, the record must end in llm.dlq with a reason.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

MODEL = "sim-llama-8b"
DUPLICATE = "\x00duplicate"  # placeholder ids, replaced by a valid request's id when sent
FOREIGN = "\x00foreign"

# The limits of InferenceRequest (messages/inference.py) and of the broker (message.max.bytes ~1 MiB).
PROMPT_MAX_CHARS = 2_000_000
BROKER_MAX_BYTES = 1_048_588
REQUEST_ID_MAX = 128
TENANT_MAX = 64
MESSAGES_MAX = 10_000
STOP_MAX = 16
MAX_TOKENS_MAX = 1_000_000


@dataclass(frozen=True)
class Hostile:
    kind: str
    key: bytes | None
    value: bytes | None

    @property
    def request_id(self) -> str | None:
        if self.value is None:
            return None
        try:
            data = json.loads(self.value)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError):
            return None
        request_id = data.get("request_id") if isinstance(data, dict) else None
        return request_id if isinstance(request_id, str) else None


def _around(limit: int) -> st.SearchStrategy[int]:
    return st.sampled_from([limit - 1, limit, limit + 1])


def _base(request_id: str) -> dict[str, object]:
    return {"request_id": request_id, "tenant": "fuzz", "model": MODEL, "prompt": "hostile", "max_tokens": 8}


@st.composite
def _request_dict(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    rid = uuid.uuid4().hex
    body = _base(rid)
    big = draw(st.integers(0, 24)) == 0  # one in 25: megabytes (the broker's and the model's size limits)
    kind = (
        draw(st.sampled_from(["prompt_size", "broker_size"]))
        if big
        else draw(
            st.sampled_from(
                [
                    "messages_count",
                    "max_tokens",
                    "numbers",
                    "request_id",
                    "tenant",
                    "seed",
                    "stop",
                    "reply_topic",
                    "surrogate",
                    "nesting",
                    "unknown_field",
                    "schema_version",
                    "duplicate",
                    "foreign",
                ]
            )
        )
    )
    if kind == "prompt_size":
        body["prompt"] = "p" * draw(_around(PROMPT_MAX_CHARS))
    elif kind == "broker_size":  # around what the broker takes, and what its DLQ copy (+33 %) no longer fits
        body["prompt"] = "b" * (draw(st.sampled_from([700_000, 790_000, 1_000_000, BROKER_MAX_BYTES])) - 200)
    elif kind == "messages_count":
        body.pop("prompt")
        body["messages"] = [{"role": "user", "content": "m"}] * draw(_around(MESSAGES_MAX))
    elif kind == "max_tokens":
        body["max_tokens"] = draw(st.sampled_from([0, 1, -1, MAX_TOKENS_MAX, MAX_TOKENS_MAX + 1, 2**63, 10**30]))
    elif kind == "numbers":
        body[draw(st.sampled_from(["temperature", "top_p", "complexity", "priority"]))] = draw(
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70))
        )
    elif kind == "request_id":
        body["request_id"] = draw(
            st.one_of(
                st.just(""),
                st.sampled_from(["\r\n", "a\r\nb", " ", "../../etc/"]).map(lambda s: s + uuid.uuid4().hex),
                st.integers(REQUEST_ID_MAX - 2, REQUEST_ID_MAX + 1).map(lambda n: "i" * (n - 32) + uuid.uuid4().hex),
                st.sampled_from([10_000, 100_000]).map(lambda n: "L" * n + uuid.uuid4().hex),
                st.text(min_size=1, max_size=40).map(lambda s: s + "\r\n" + uuid.uuid4().hex),
                st.integers(),
                st.none(),
                st.lists(st.integers(), max_size=3),
            )
        )
    elif kind == "tenant":
        body["tenant"] = draw(st.one_of(st.text(max_size=80), _around(TENANT_MAX).map(lambda n: "t" * n)))
    elif kind == "seed":
        body["seed"] = draw(st.sampled_from([2**31 - 1, 2**32, 2**63, 2**64 + 1, -(2**70), 10**100]))
        body["temperature"] = 0.0
    elif kind == "stop":
        body["stop"] = draw(
            st.one_of(
                _around(STOP_MAX).map(lambda n: [f"s{i}" for i in range(n)]),
                st.just(["x" * 100_000]),
                st.lists(st.text(max_size=10), min_size=1, max_size=STOP_MAX),
            )
        )
    elif kind == "reply_topic":
        body["reply_topic"] = draw(
            st.sampled_from(
                [
                    "llm.results",
                    "llm.requests",
                    "llm.routed",
                    "llm.outcomes",
                    "llm.workers",
                    "llm.dlq",
                    "llm.control",
                    "llm.dispatch.w1",
                    # Not drawn: reply topics that do not exist (llm.no-such-topic-…, over-long names,
                    # "llm.."). A producer waits for their metadata until its request timeout, which
                    # stalls a worker; which reply topics a client may name is issue 10's policy.
                    "",
                    "other.topic",
                ]
            )
        )
    elif kind == "surrogate":
        body[draw(st.sampled_from(["prompt", "user_id", "category"]))] = "lone \ud800 surrogate \udfff"
        if draw(st.booleans()):
            body["request_id"] = f"sur\udc80{rid}"
    elif kind == "nesting":
        body["metadata"] = "@NEST@"
    elif kind == "unknown_field":
        body[draw(st.text(min_size=1, max_size=20).filter(lambda k: k not in body))] = draw(st.integers())
    elif kind == "schema_version":
        body["schema_version"] = draw(st.sampled_from([0, 2, -1, 10**20, "1"]))
    elif kind == "duplicate":
        body["request_id"] = DUPLICATE
    elif kind == "foreign":
        body["request_id"] = FOREIGN
        body["tenant"] = "intruder"
    return kind, body


def _encode(body: dict[str, object], depth: int) -> bytes:
    text = json.dumps(body)  # lone surrogates travel as \\udXXX escapes, as JSON allows
    if '"@NEST@"' in text:
        text = text.replace('"@NEST@"', '{"a":' * depth + "1" + "}" * depth)
    return text.encode()


_GARBAGE = st.one_of(
    st.binary(max_size=2000),
    st.sampled_from(
        [b"", b"null", b"[]", b"1e999999", b'"just a string"', b"{", b"\xff\xfe{}", b'{"prompt": "no id"}']
    ),
    st.just(None),  # a tombstone
    st.integers(1, 1000).map(lambda n: b"[" * n * 100),
)


@st.composite
def hostile_record(draw: st.DrawFn) -> Hostile:
    if draw(st.integers(0, 9)) < 2:
        key = draw(st.one_of(st.none(), st.binary(max_size=300)))
        return Hostile("garbage", key, draw(_GARBAGE))
    kind, body = draw(_request_dict())
    depth = draw(st.sampled_from([100, 10_000, 200_000]))
    key = draw(st.one_of(st.none(), st.just(b"same-key"), st.binary(max_size=64)))
    return Hostile(kind, key, _encode(body, depth))


def draw_corpus(count: int, seed_value: int = 20261130) -> list[Hostile]:
    """`count` hostile records, of the same kinds and sizes for the same seed (ids are fresh uuids).

    One Hypothesis run of `count` examples: its first ones are its simplest, the rest are varied.
    """
    out: list[Hostile] = []

    @seed(seed_value)
    @settings(
        max_examples=count,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    @given(hostile_record())
    def _draw(record: Hostile) -> None:
        out.append(record)

    _draw()
    return out
