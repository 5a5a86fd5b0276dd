"""Where the llmbus path's first-token latency goes at c = 1: one figure per hop, from Kafka record timestamps.

The llmbus path of the peer benchmark (bench.peer_llmbus: gateway → router → scheduler → openai-http
worker, in front of bench.peer_upstream) takes N streamed chat requests one at a time. For each, the
client keeps the wall-clock time of its send and of the first SSE event with text, and the
gateway's `x-request-id` (the bus request id). Then the run's namespace is read back (records
from the measured window of llm.requests, llm.routed, llm.dispatch.<worker>, the gateway's reply
topic and llm.results) and each request's records are placed by their timestamps. The producers
stamp them (CreateTime: aiokafka takes time.time() when a record is appended to its batch; the
catalog sets no `message.timestamp.type`), in whole milliseconds: a record is put at the middle of
its millisecond (+0.5 ms), so a hop's median is unbiased but any one hop of one request is ±1 ms.
A hop spans from one record's append to the next one's: the producer's send, the broker, the next
service's fetch and its work. The upstream called directly by the same client is measured too.

    python -m bench.peer_hops [--requests 300] [--warmup 30] [--infra shared|private]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench import peer_llmbus, peer_targets
from bench.peer_bench import run_facts, versions, warnings
from bench.peer_load import Connection, _Response, chat_body, closed_loop
from bench.peer_report import closing_lines
from bench.peer_targets import Target
from bench.pipeline_queued import percentiles
from llmbus.bus.admin import topics_matching
from llmbus.bus.codec import BadMessage, decode
from llmbus.bus.tables import records_since
from llmbus.contract import messages as m
from llmbus.contract.topics import REPLIES_PREFIX, REQUESTS, RESULTS, ROUTED, Topics
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import REPO

REPORTS = REPO / "bench" / "reports"
# (hop, what it spans, from, to): the stages are the client's two times and the records' timestamps.
HOPS = (
    ("gateway", "client send → its llm.requests record", "sent", "requests"),
    ("router", "llm.requests → llm.routed (gateway's send, router's fetch and work)", "requests", "routed"),
    ("scheduler", "llm.routed → llm.dispatch.<worker>", "routed", "dispatch"),
    ("worker", "dispatch → first reply chunk with text (incl. the upstream call)", "dispatch", "chunk"),
    ("gateway reply", "first reply chunk → client's first token (reply tail, SSE)", "chunk", "first_token"),
)
TIMESTAMP_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


class _WithId(_Response):
    """A response that keeps the gateway's `x-request-id`."""

    request_id: str | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"x-request-id":
            self.request_id = value.decode()


@dataclass
class Sent:
    request_id: str | None
    sent_ms: float  # wall clock (ms since the epoch, fractional)
    first_token_ms: float | None
    error: str | None


async def one_at_a_time(target: Target, requests: int, tokens: int, tag: str) -> list[Sent]:
    """`requests` streamed chats on one keep-alive connection, each sent when the last one ended."""
    url = urlsplit(target.base_url)
    conn = Connection(url.hostname or "127.0.0.1", url.port or 80)
    out: list[Sent] = []
    try:
        for i in range(requests):
            to_wall_ms = time.time_ns() / 1e6 - time.perf_counter() * 1000  # the driver's perf_counter → wall clock
            body = chat_body(target.model, tokens, tag, i)
            started, response = await conn.post(
                url.path.rstrip("/") + "/chat/completions", body, target.headers, 60.0, _WithId()
            )
            assert isinstance(response, _WithId)
            error = response.error or (f"HTTP {response.status}" if response.status != 200 else None)
            first = to_wall_ms + response.first_token_s * 1000 if response.first_token_s is not None else None
            out.append(
                Sent(response.request_id, to_wall_ms + started * 1000, first, error or (None if first else "no token"))
            )
            if (i + 1) % 50 == 0:
                print(f"[hops] {tag}: {i + 1}/{requests}", file=sys.stderr, flush=True)
    finally:
        await conn.close()
    return out


async def record_times(settings: BusSettings, since_ms: int) -> tuple[dict[str, dict[str, float]], set[str]]:
    """stage → request id → its earliest record's timestamp (ms, the middle of its millisecond), and the
    timestamp types seen."""
    topics = Topics(settings.topic_prefix)
    replies = await topics_matching(settings, re.compile(re.escape(topics.name(REPLIES_PREFIX))))
    assert len(replies) == 1, f"one gateway's reply topic expected, found {replies}"
    readers: dict[str, tuple[str, type[m.Message], Callable]] = {
        "requests": (topics.name(REQUESTS), m.InferenceRequest, lambda x: x.request_id),
        "routed": (topics.name(ROUTED), m.RoutedRequest, lambda x: x.request.request_id),
        "dispatch": (topics.dispatch(peer_llmbus.WORKER_ID), m.Dispatch, lambda x: x.request_id),
        "chunk": (replies[0], m.TokenChunk, lambda x: x.request_id if x.delta else None),
        "result": (topics.name(RESULTS), m.InferenceResult, lambda x: x.request_id),
    }
    times: dict[str, dict[str, float]] = {}
    types: set[str] = set()
    for stage, (topic, model, id_of) in readers.items():
        found: dict[str, float] = {}
        for record in await records_since(settings, topic, since_ms, timeout_s=60):
            try:
                request_id = id_of(decode(record, model))
            except BadMessage:
                continue
            types.add(TIMESTAMP_TYPES.get(record.timestamp_type, str(record.timestamp_type)))
            if request_id is not None:
                found[request_id] = min(found.get(request_id, float("inf")), record.timestamp + 0.5)
        times[stage] = found
        print(f"[hops] {topic}: {len(found)} request ids", file=sys.stderr, flush=True)
    return times, types


def _stats(values: list[float]) -> dict[str, float | None]:
    return percentiles(values, (50, 90), 2) | {"mean": round(statistics.fmean(values), 2) if values else None}


def hop_table(sent: list[Sent], times: dict[str, dict[str, float]]) -> tuple[list[dict], list[float], int]:
    """Per hop p50 / p90 / mean (ms) over the requests every stage saw; their end-to-end times; how many."""
    complete: list[dict[str, float]] = [
        {"sent": s.sent_ms, "first_token": s.first_token_ms} | {k: v[s.request_id] for k, v in times.items()}
        for s in sent
        if s.error is None
        and s.first_token_ms is not None
        and s.request_id is not None
        and all(s.request_id in v for v in times.values())
    ]
    rows = [
        {"hop": hop, "span": span} | _stats([r[end] - r[start] for r in complete]) for hop, span, start, end in HOPS
    ]
    rows.append(
        {"hop": "(after: result)", "span": "first reply chunk → llm.results record (not on the first token's path)"}
        | _stats([r["result"] - r["chunk"] for r in complete])
    )
    return rows, [r["first_token"] - r["sent"] for r in complete], len(complete)


def tensorzero_added_ms() -> tuple[float, str] | None:
    """TensorZero's first token added over direct at c = 1 (project driver) in bench/reports/peer.json."""
    path = REPORTS / "peer.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    for c in report.get("comparisons", []):
        if c["target"] == "TensorZero" and c["driver"] == "own" and c["concurrency"] == 1:
            return c["first_token_added_ms"], f"bench/reports/peer.json, run of {report['started']}"
    return None


async def amain(args: argparse.Namespace, work: Path) -> dict:
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now().isoformat(timespec="seconds")
    infra_cm = peer_llmbus.private_infra(work) if args.infra == "private" else peer_llmbus.shared_infra()
    async with infra_cm as infra, peer_targets.upstream(work, args.tokens) as upstream:
        print("[hops] upstream direct", file=sys.stderr, flush=True)
        common = {"concurrency": 1, "tokens": args.tokens}
        await closed_loop(upstream.base_url, upstream.model, {}, requests=args.warmup, tag="hw-direct", **common)
        direct_samples, _ = await closed_loop(
            upstream.base_url, upstream.model, {}, requests=args.requests, tag="h-direct", **common
        )
        print("[hops] starting llmbus", file=sys.stderr, flush=True)
        async with peer_llmbus.llmbus("llmbus", REPO, upstream.base_url, infra, work) as target:
            assert target.bus_settings is not None
            await one_at_a_time(target, args.warmup, args.tokens, "hw")
            since_ms = time.time_ns() // 1_000_000 - 1
            sent = await one_at_a_time(target, args.requests, args.tokens, "h")
            await asyncio.sleep(1.0)  # the last results are written after the last answer
            times, types = await record_times(target.bus_settings, since_ms)
            all_versions = versions() | target.versions
            notes = target.notes
    rows, end_to_end, matched = hop_table(sent, times)
    direct_first = [s.first_token_ms for s in direct_samples if s.error is None and s.first_token_ms is not None]
    e2e = _stats(end_to_end)
    direct = percentiles(direct_first, (50, 90), 3)
    tensorzero = tensorzero_added_ms()
    return {
        **run_facts(args.command, started, loadavg_start),
        "requests": args.requests,
        "warmup": args.warmup,
        "tokens": args.tokens,
        "infra": args.infra,
        "timestamp_types": sorted(types),
        "errors": sum(s.error is not None for s in sent),
        "matched": matched,
        "hops": rows,
        "sum_of_hop_medians_ms": round(sum(r["p50"] or 0.0 for r in rows[: len(HOPS)]), 2),
        "end_to_end_first_token_ms": e2e,
        "direct_first_token_ms": direct,
        "added_over_direct_p50_ms": round((e2e["p50"] or 0.0) - (direct["p50"] or 0.0), 2),
        "tensorzero_added_ms": tensorzero,
        "versions": all_versions,
        "notes": notes,
        "warnings": warnings(loadavg_start, []),
    }


def markdown(report: dict, png_name: str) -> str:
    e2e, direct = report["end_to_end_first_token_ms"], report["direct_first_token_ms"]
    lines = [
        "# The llmbus path's first token at c = 1, hop by hop",
        "",
        f"Command: `{report['command']}`  ",
        f"Run: {report['started']} → {report['finished']}; machine: {report['machine']}; "
        f"broker and Redis: {report['infra']}  ",
        f"Load average (1, 5, 15 min) at the start: {report['loadavg_start']}, at the end: {report['loadavg_end']}",
        "",
        f"{report['requests']} streamed chat requests ({report['tokens']}-token answers) one at a time through the "
        f"llmbus path of the peer benchmark (`bench/peer_llmbus.py`) after {report['warmup']} warm-up requests; "
        f"{report['matched']} had a record at every stage ({report['errors']} errors). The client's times are wall "
        "clock; the records' are their Kafka timestamps "
        f"({', '.join(report['timestamp_types'])}: set by the producing service when it appends the record to its "
        "batch), **whole milliseconds**, each put at the middle of its millisecond: a hop's median is good to "
        "about ±0.5 ms, any one request's hop to ±1 ms. A hop runs from one record's append to the next: the "
        "producer's send, the broker, the next service's fetch, its work.",
        "",
        *(["**Read with care:**", "", *[f"- {w}" for w in report["warnings"]], ""] if report["warnings"] else []),
        "| hop | span | p50 (ms) | p90 (ms) | mean (ms) |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r['hop']} | {r['span']} | {r['p50']} | {r['p90']} | {r['mean']} |" for r in report["hops"]]
    lines += [
        "",
        f"- Sum of the five hops' medians: **{report['sum_of_hop_medians_ms']} ms**; measured client send → first "
        f"token: p50 **{e2e['p50']} ms**, p90 {e2e['p90']} ms (a sum of medians is not the median of sums). The "
        f"hops' means add up to the mean, {e2e['mean']} ms, by construction: each record's time ends one hop and "
        "starts the next.",
        f"- The upstream called directly by the same client in the same run: first token p50 {direct['p50']} ms, "
        f"p90 {direct['p90']} ms; llmbus adds {report['added_over_direct_p50_ms']} ms at p50.",
    ]
    if report["tensorzero_added_ms"] is not None:
        added, source = report["tensorzero_added_ms"]
        lines.append(
            f"- The issue's target, ≤ 3 x TensorZero's added first token ({added} ms in {source}): ≤ "
            f"{round(3 * added, 2)} ms added; llmbus is {round(report['added_over_direct_p50_ms'] - 3 * added, 2)} "
            "ms over it."
        )
    return "\n".join([*lines, "", *closing_lines(report, "Path", png_name, "hops")])


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hops = report["hops"][: len(HOPS)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.bar([h["hop"] for h in hops], [h["p50"] or 0.0 for h in hops], label="p50")
    ax.scatter([h["hop"] for h in hops], [h["p90"] or 0.0 for h in hops], color="k", marker="_", s=400, label="p90")
    ax.set_ylabel("ms")
    ax.legend(loc="upper left")
    e2e = report["end_to_end_first_token_ms"]["p50"]
    ax.set_title(
        f"llmbus first token at c=1 by hop (medians sum to {report['sum_of_hop_medians_ms']} ms; end to end p50 "
        f"{e2e} ms)\nKafka record timestamps (ms resolution), load average at start {report['loadavg_start'][0]}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="measured requests (one at a time)")
    parser.add_argument("--warmup", type=int, default=30, help="warm-up requests before them")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--infra", choices=("private", "shared"), default="shared", help="llmbus's broker and Redis")
    parser.add_argument("--out", type=Path, default=REPORTS / "peer_hops")
    args = parser.parse_args(argv)
    args.command = " ".join(
        ["python -m bench.peer_hops", shlex.join(argv if argv is not None else sys.argv[1:])]
    ).strip()
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a `timeout` unwinds: every process stopped
    with tempfile.TemporaryDirectory(prefix="llmbus-peer-hops-") as tmp:
        report = asyncio.run(amain(args, Path(tmp)))
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report, out.with_suffix(".png").name))
    plot(report, out.with_suffix(".png"))
    print(f"[hops] wrote {out}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
