"""The router's own throughput and the latency it adds beyond the Kafka hops, on the real broker.

    python -m bench.router_bench [--rate 500] [--seconds 8] [--backlog 20000]

Two processes are measured the same way, each in its own topic namespace:
  * the router (`python -m llmbus_services.router`, the shipped policy with an A/B and a 10 %
    shadow experiment; tenant limits raised so nothing is refused, but every request still
    takes its Redis token bucket; 10 % of requests are deterministic and hit the cache path);
  * a null forwarder (bench/router_null_forwarder.py): same consumer loop and producer,
    decode → RoutedRequest → publish, no routing.

Latency phase: requests paced at --rate for --seconds; latency = client send → routed
record read back by the bench (two Kafka hops + the process). Added latency = router
minus null forwarder at each percentile; the router's own handler time
(routed_at_ms - received_at_ms, ms resolution, excludes the publish ack) is reported too.
Throughput phase: the process is paused (SIGSTOP), --backlog requests are produced,
it is resumed (SIGCONT) and the rate at which it drains the backlog is measured from the
routed records' broker timestamps (the router's own send times).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import yaml
from aiokafka import AIOKafkaProducer

from llmbus.bus import Bus
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Experiment, Variant
from llmbus_services.router.core.config import load_policy
from llmbus_tools.harness.service_procs import ServiceProc, fresh_settings
from llmbus_tools.router_training.corpus import HAND_PATH

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "bench" / "reports"
DATA = HAND_PATH


def log(msg: str) -> None:
    print(f"[router_bench] {msg}", file=sys.stderr, flush=True)


class Workload:
    """Varied requests: labelled prompts (the scorer runs), editor traffic, explicit complexity, cacheable ones."""

    def __init__(self) -> None:
        self.prompts = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
        self.n = 0

    def next(self, tag: str) -> tuple[str, bytes]:
        i = self.n
        self.n += 1
        row = self.prompts[i % len(self.prompts)]
        rid = f"{tag}-{i}"
        body: dict[str, object] = {
            "request_id": rid,
            "tenant": f"tenant-{i % 20}",
            "user_id": f"user-{i % 5000}",
            "messages": [{"role": "user", "content": row["prompt"]}],
            "category": row["category"],
            "max_tokens": 256,
            "metadata": {"bench_sent_ns": str(time.time_ns())},
        }
        if i % 10 == 0:
            body["temperature"] = 0.0  # cacheable: lookup + pending mark in Redis
        if i % 7 == 0:
            body["complexity"] = 0.9
        return rid, json.dumps(body).encode()


async def make_producer(bootstrap: str) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    await asyncio.wait_for(producer.start(), 30)
    return producer


async def drain(tail: TopicTail, want: int, timeout_s: float, on_record) -> int:  # type: ignore[no-untyped-def]
    got = 0
    async for record in tail.records(timeout_s):
        if on_record(record):
            got += 1
            if got % 2000 == 0:
                log(f"  {got}/{want} routed")
            if got >= want:
                break
    return got


def primary(record) -> dict | None:  # type: ignore[no-untyped-def]
    data = json.loads(record.value)
    return None if data.get("shadow") else data


def write_policy(raw: dict, path: str) -> str:
    Path(path).write_text(yaml.safe_dump(raw))
    return path


async def measure(kind: str, rate: float, seconds: float, backlog: int) -> dict:
    settings = fresh_settings()
    await ensure_catalog(settings)
    topics = t.Topics(settings.topic_prefix)
    env: dict[str, str] = {}
    if kind == "router":
        raw = load_policy().model_dump(mode="json", exclude_none=True)
        raw["tenants"]["default"] |= {"requests_per_s": 1e6, "burst_requests": 1_000_000, "tokens_per_min": 10**12}
        env["LLMBUS_ROUTER_POLICY_PATH"] = write_policy(raw, f"/tmp/{settings.topic_prefix}router-bench-policy.yaml")
        bus = await Bus.start(settings, t.CLIENT)
        for exp in (
            Experiment(
                experiment_id="ab",
                kind="ab",
                salt="b",
                match_models=["gpt-4.1-mini"],
                variants=[
                    Variant(name="a", model="gpt-4.1-mini", weight=1),
                    Variant(name="b", model="llama-3.3-70b-instruct", weight=1),
                ],
            ),
            Experiment(experiment_id="sh", kind="shadow", salt="s", shadow_model="sim-llama-8b", shadow_share=0.1),
        ):
            await bus.publisher.publish(topics.name(t.EXPERIMENTS), exp, key=exp.experiment_id)
        await bus.stop()
    module = "llmbus_services.router" if kind == "router" else "bench.router_null_forwarder"
    proc = ServiceProc(module, settings, env=env, name=kind).start()
    assert proc.proc is not None
    tail = await TopicTail(settings, topics.name(t.ROUTED)).start()
    producer = await make_producer(settings.kafka_bootstrap)
    work = Workload()
    requests_topic = topics.name(t.REQUESTS)
    try:
        log(f"{kind}: warming up")
        for _ in range(300):
            rid, body = work.next("warm")
            await producer.send(requests_topic, body, key=rid.encode())
        await producer.flush()
        if await drain(tail, 300, 90, primary) < 300:
            raise RuntimeError(f"{kind} did not route the warm-up requests; log:\n{proc.log_tail()}")

        log(f"{kind}: latency phase, {rate:.0f} req/s for {seconds:.0f} s")
        latencies_ms: list[float] = []
        handler_ms: list[float] = []
        sent = int(rate * seconds)

        def on_latency(record) -> bool:  # type: ignore[no-untyped-def]
            data = primary(record)
            if data is None or not data["request"]["request_id"].startswith("lat-"):
                return False
            latencies_ms.append((time.time_ns() - int(data["request"]["metadata"]["bench_sent_ns"])) / 1e6)
            handler_ms.append(data["routed_at_ms"] - data["received_at_ms"])
            return True

        reader = asyncio.create_task(drain(tail, sent, seconds + 60, on_latency))
        started = time.perf_counter()
        tick_s = 0.01
        for i in range(sent):
            due = started + i / rate
            if (wait := due - time.perf_counter()) > 0:
                await asyncio.sleep(min(wait, tick_s))
            rid, body = work.next("lat")
            await producer.send(requests_topic, body, key=rid.encode())
        await producer.flush()
        got = await reader
        log(f"{kind}: {got}/{sent} latency requests routed")

        log(f"{kind}: throughput phase, backlog of {backlog}")
        os.kill(proc.proc.pid, signal.SIGSTOP)  # our own child: hold it while the backlog builds
        try:
            for _ in range(backlog):
                rid, body = work.next("tp")
                await producer.send(requests_topic, body, key=rid.encode())
            await producer.flush()
        finally:
            os.kill(proc.proc.pid, signal.SIGCONT)
        stamps_ms: list[int] = []

        def on_tp(record) -> bool:  # type: ignore[no-untyped-def]
            data = primary(record)
            if data is None or not data["request"]["request_id"].startswith("tp-"):
                return False
            stamps_ms.append(record.timestamp)
            return True

        drained = await drain(tail, backlog, 180, on_tp)
        span_s = (max(stamps_ms) - min(stamps_ms)) / 1000 if len(stamps_ms) > 1 else float("nan")
        return {
            "kind": kind,
            "latency_sent": sent,
            "latency_routed": got,
            "latency_ms": percentiles(latencies_ms),
            "handler_ms": percentiles(handler_ms),
            "latency_samples_ms": latencies_ms,
            "backlog": backlog,
            "backlog_routed": drained,
            "throughput_per_s": drained / span_s if span_s > 0 else None,
        }
    finally:
        await producer.stop()
        await tail.stop()
        proc.terminate(30)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    arr = np.asarray(values)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p95": float(np.percentile(arr, 95)),
        "p99": float(np.percentile(arr, 99)),
        "max": float(arr.max()),
    }


def write_reports(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, color in (("router", "tab:red"), ("null", "tab:blue")):
        samples = np.sort(np.asarray(report[key].pop("latency_samples_ms")))
        if len(samples):
            ax1.plot(
                samples,
                np.arange(1, len(samples) + 1) / len(samples),
                color=color,
                label=f"{key} (p99 {report[key]['latency_ms']['p99']:.1f} ms)",
            )
    ax1.set_xscale("log")
    ax1.set_xlabel("client send → routed record read (ms)")
    ax1.set_ylabel("fraction of requests")
    ax1.set_title(f"latency at {report['rate']:.0f} req/s")
    ax1.legend(fontsize=8)
    rates = [report[k]["throughput_per_s"] or 0 for k in ("router", "null")]
    ax2.bar(["router", "null forwarder"], rates, color=["tab:red", "tab:blue"])
    ax2.axhline(2000, color="black", linestyle="--", label="target 2,000/s")
    ax2.set_ylabel("routed requests / s (backlog drain)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "router_bench.png", dpi=110)
    plt.close(fig)
    (out / "router_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "router_bench.md").write_text(render_md(report))


def render_md(r: dict) -> str:
    def f(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.2f}"

    rl, nl, add = r["router"]["latency_ms"], r["null"]["latency_ms"], r["added_latency_ms"]
    lines = [
        "# Router benchmark (real Kafka broker + Redis)",
        "",
        f"Command: `{r['command']}`  ",
        f"Machine: {r['cpus']} CPUs, shared with the broker, Redis, the bench client and other jobs.",
        "",
        "| | router | null forwarder | added by routing |",
        "|---|---|---|---|",
        *[f"| latency {p} (ms) | {f(rl[p])} | {f(nl[p])} | {f(add[p])} |" for p in ("p50", "p95", "p99")],
        f"| router handler time p99 (ms, excl. publish ack) | {f(r['router']['handler_ms']['p99'])} | "
        f"{f(r['null']['handler_ms']['p99'])} | |",
        f"| backlog drain (routed requests/s) | {f(r['router']['throughput_per_s'])} | "
        f"{f(r['null']['throughput_per_s'])} | |",
        "",
        f"Targets: ≥ 2,000 routed requests/s → **{'met' if r['meets_throughput'] else 'not met'}**; "
        f"≤ 5 ms added p99 → **{'met' if r['meets_latency'] else 'not met'}**.",
        "",
        f"Latency phase: {r['rate']:.0f} req/s for {r['seconds']:.0f} s "
        f"({r['router']['latency_routed']}/{r['router']['latency_sent']} routed by the router). "
        f"Throughput phase: backlog of {r['backlog']} requests.",
        "Added latency is the router's percentile minus the null forwarder's (same hops, no routing).",
        "",
        "![router bench](router_bench.png)",
        "",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict:
    results: dict[str, dict] = {}
    for kind in ("router", "null"):
        results[kind] = await measure(kind, args.rate, args.seconds, args.backlog)
    added = {
        p: (results["router"]["latency_ms"][p] or 0) - (results["null"]["latency_ms"][p] or 0)
        for p in ("p50", "p95", "p99")
    }
    return {
        "command": "python -m bench.router_bench " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "rate": args.rate,
        "seconds": args.seconds,
        "backlog": args.backlog,
        "router": results["router"],
        "null": results["null"],
        "added_latency_ms": added,
        "meets_throughput": (results["router"]["throughput_per_s"] or 0) >= 2000,
        "meets_latency": added["p99"] <= 5.0,
        "run_id": uuid.uuid4().hex[:8],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=500.0, help="paced requests/s in the latency phase")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--backlog", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=REPORTS)
    args = ap.parse_args()
    report = asyncio.run(run(args))
    write_reports(report, args.out)
    print(render_md(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
