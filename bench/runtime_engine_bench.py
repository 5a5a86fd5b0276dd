"""FastStream 0.7 against llmbus's ConsumerLoop on the same handler: throughput, CPU per record, and what a
SIGKILL mid-batch costs (records handled twice, records lost).

    python -m bench.runtime_engine_bench     # writes bench/reports/runtime_engine.{json,md,png}

The handler (`Flow.handle`) has a flow's shape: the record decoded (each engine its own way: FastStream's
typed handler, llmbus's codec), its effect applied in Redis (HINCRBY of its id: how often it was handled),
a derived record published through llmbus's Publisher and acknowledged; the engine commits the offset
after. Engines, each in its own process on uvloop, each on its own namespace and consumer group:
  consumerloop           llmbus.bus.service.ServiceRuntime: up to CONCURRENCY records of a partition at
                         once, offsets committed in offset order after their handlers
  faststream-partitions  FastStream 0.7 KafkaBroker, ack_policy=ACK (acked after the handler),
                         max_workers=PARTITIONS: concurrent between partitions, one record at a time in each
  faststream-concurrent  FastStream 0.7 with faststream-concurrent-aiokafka 0.7.2 (the maintained
                         concurrency middleware): AckPolicy.MANUAL, CONCURRENCY records at once, each
                         partition's contiguous prefix of done records committed
  faststream-ack-first   FastStream's default ack policy (ACK_FIRST: offsets committed as fetched) with
                         max_workers=CONCURRENCY, for what committing before the handler costs
Runs:
  throughput  RECORDS waiting on an 8-partition topic; records/s from the first record handled to the
              last; CPU per record = the process's CPU time over that span / RECORDS; REPEAT runs per
              engine, interleaved, the median reported.
  SIGKILL     KILL_RECORDS waiting; the process SIGKILLed once a third of them are handled, a new one
              started in the same group; once the group's committed offsets reach the end (and 2 s
              more): records handled more than once, and records never handled (lost).
Pass criteria, fixed before the run: FastStream is adopted for an engine that carries at least 0.9x
ConsumerLoop's records/s at no more than 1.1x its CPU per record, and loses no record after a SIGKILL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import psutil
import redis.asyncio as redis
import uvloop
from aiokafka import TopicPartition

from llmbus.bus.admin import ensure_topics, open_admin
from llmbus.bus.runtime import Bus
from llmbus.bus.service import ServiceRuntime
from llmbus.bus.tables import reader
from llmbus.contract.declarations import Contract, Reads, Writes
from llmbus.contract.messages import InferenceResult, ResultStatus, Usage
from llmbus.contract.topics import TopicSpec
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings

REPORTS = Path(__file__).parent / "reports"
COMMAND = "python -m bench.runtime_engine_bench"
ENGINES = ("consumerloop", "faststream-partitions", "faststream-concurrent", "faststream-ack-first")
PARTITIONS = 8
IN, OUT = "bench.engine.in", "bench.engine.out"
SERVICE = "engine-bench"


def log(msg: str) -> None:
    print(f"[runtime_engine_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def counts_key(prefix: str) -> str:
    return f"{prefix}engine-bench:handled"


# ---- the handler, the same in every engine ---------------------------------------------------
class Flow:
    def __init__(self, settings: BusSettings, bus: Bus) -> None:
        self.redis = redis.Redis.from_url(settings.redis_url, socket_timeout=10)
        self.bus = bus
        self.key = counts_key(settings.topic_prefix)
        self.out = settings.topic_prefix + OUT

    async def handle(self, result: InferenceResult) -> None:
        await self.redis.hincrby(self.key, result.request_id, 1)  # the effect: how often it was handled
        await self.bus.publisher.publish(self.out, result, key=result.request_id)


# ---- the engines (child processes) ------------------------------------------------------------
async def consumerloop(settings: BusSettings, concurrency: int, stop: asyncio.Event) -> None:
    contract = Contract(
        SERVICE,
        reads=(Reads("in", (IN,), InferenceResult, max_in_flight=concurrency),),
        writes=(Writes(OUT, InferenceResult),),
    )
    runtime = await ServiceRuntime.connect(settings, contract)
    flow = Flow(settings, runtime.bus)
    runtime.subscribe("in", flow.handle)
    await runtime.run(stop)


async def faststream(settings: BusSettings, engine: str, concurrency: int) -> None:
    """FastStream's own app: it stops on SIGTERM (its signal handling), its broker's consumers first."""
    from contextlib import asynccontextmanager

    from faststream import FastStream
    from faststream.kafka import KafkaBroker
    from faststream.middlewares import AckPolicy

    # Per-message logs at DEBUG (filtered): llmbus's loop writes none per record either.
    broker = KafkaBroker(settings.kafka_bootstrap, log_level=logging.DEBUG)
    options: dict[str, Any] = {"group_id": group_of(settings), "auto_offset_reset": "earliest"}
    if engine == "faststream-partitions":
        options |= {"ack_policy": AckPolicy.ACK, "max_workers": PARTITIONS}
    elif engine == "faststream-concurrent":
        from faststream_concurrent_aiokafka import KafkaConcurrentProcessingMiddleware

        broker.add_middleware(KafkaConcurrentProcessingMiddleware)  # the outermost, as its docs ask
        options |= {"ack_policy": AckPolicy.MANUAL}
    else:
        options |= {"ack_policy": AckPolicy.ACK_FIRST, "max_workers": concurrency}
    bus = await Bus.start(settings, SERVICE)
    flow = Flow(settings, bus)

    @broker.subscriber(settings.topic_prefix + IN, **options)
    async def on_result(result: InferenceResult) -> None:
        await flow.handle(result)

    @asynccontextmanager
    async def lifespan() -> AsyncIterator[None]:
        if engine != "faststream-concurrent":
            yield
            return
        from faststream_concurrent_aiokafka import initialize_concurrent_processing, stop_concurrent_processing

        await initialize_concurrent_processing(
            context=broker.context, concurrency_limit=concurrency, commit_batch_size=100, commit_batch_timeout_sec=0.2
        )
        try:
            yield
        finally:
            await stop_concurrent_processing(broker.context)

    try:
        await FastStream(broker, lifespan=lifespan).run(log_level=logging.WARNING)
    finally:
        await bus.stop()


def group_of(settings: BusSettings) -> str:
    return f"{settings.topic_prefix}llmbus.{SERVICE}"  # the group ServiceRuntime's declaration gives


def child(engine: str, prefix: str, concurrency: int) -> None:
    settings = BusSettings(topic_prefix=prefix, log_json=False, log_level="WARNING")
    logging.basicConfig(level=logging.WARNING)

    async def run() -> None:
        if engine != "consumerloop":
            await faststream(settings, engine, concurrency)
            return
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await consumerloop(settings, concurrency, stop)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())


# ---- the parent: records in, the engine timed and killed --------------------------------------
@dataclass
class Throughput:
    records: int
    seconds: float
    records_per_s: float
    cpu_s: float
    cpu_us_per_record: float


@dataclass
class Redelivery:
    records: int
    handled_when_killed: int
    handled_twice: int
    extra_handlings: int
    lost: int


def start_child(engine: str, settings: BusSettings, concurrency: int) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench.runtime_engine_bench", "--child", engine]
    command += ["--prefix", settings.topic_prefix, "--concurrency", str(concurrency)]
    return subprocess.Popen(command, env=os.environ.copy())


def stop_child(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def prepared(records: int) -> tuple[BusSettings, redis.Redis]:
    """A namespace with RECORDS results waiting on its input topic."""
    settings = fresh_settings(log_level="WARNING")
    spec = TopicSpec(IN, "request id", InferenceResult, partitions=PARTITIONS, retention_ms=3_600_000)
    await ensure_topics(settings, [(settings.topic_prefix + IN, spec), (settings.topic_prefix + OUT, spec)])
    bus = await Bus.start(settings, SERVICE)
    try:
        batch = []
        for i in range(records):
            result = InferenceResult(
                request_id=f"r{i}",
                tenant="bench",
                status=ResultStatus.OK,
                model="m",
                text="the answer " * 8,
                usage=Usage(prompt_tokens=100, completion_tokens=16),
            )
            batch.append((result, None, result.request_id))
        for start in range(0, records, 2000):
            await bus.publisher.publish_many(settings.topic_prefix + IN, batch[start : start + 2000])
    finally:
        await bus.stop()
    return settings, redis.Redis.from_url(settings.redis_url, socket_timeout=10)


async def wait_handled(client: redis.Redis, key: str, at_least: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while (handled := int(await client.hlen(key))) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{handled} of {at_least} handled within {timeout_s}s")
        await asyncio.sleep(0.02)
    return handled


async def throughput(engine: str, records: int, concurrency: int) -> Throughput:
    settings, client = await prepared(records)
    key = counts_key(settings.topic_prefix)
    proc = start_child(engine, settings, concurrency)
    try:
        await wait_handled(client, key, 1, 120)
        t0, cpu0 = time.monotonic(), sum(psutil.Process(proc.pid).cpu_times()[:2])
        await wait_handled(client, key, records, 600)
        t1, cpu1 = time.monotonic(), sum(psutil.Process(proc.pid).cpu_times()[:2])
    finally:
        stop_child(proc)
        await client.delete(key)
        await client.aclose()
        await drop_namespace(settings)
    seconds, cpu_s = t1 - t0, cpu1 - cpu0
    return Throughput(
        records, round(seconds, 2), round(records / seconds), round(cpu_s, 2), round(cpu_s / records * 1e6)
    )


async def lag(settings: BusSettings) -> int:
    """Records of the input topic the group has not committed past."""
    tps = [TopicPartition(settings.topic_prefix + IN, p) for p in range(PARTITIONS)]
    async with open_admin(settings) as admin:
        committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group_of(settings)), 30)
    consumer = reader(settings)
    await asyncio.wait_for(consumer.start(), 30)
    try:
        ends = await asyncio.wait_for(consumer.end_offsets(tps), 30)
    finally:
        await asyncio.wait_for(consumer.stop(), 30)
    return sum(ends[tp] - (committed[tp].offset if tp in committed else 0) for tp in tps)


async def redelivery(engine: str, records: int, concurrency: int) -> Redelivery:
    settings, client = await prepared(records)
    key = counts_key(settings.topic_prefix)
    proc = start_child(engine, settings, concurrency)
    try:
        await wait_handled(client, key, records // 3, 300)
        proc.kill()  # SIGKILL mid-batch: no drain, no final commit
        proc.wait()
        killed_at = int(await client.hlen(key))
        proc = start_child(engine, settings, concurrency)
        deadline = time.monotonic() + 600
        while await lag(settings) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        await asyncio.sleep(2)  # what the last commit let through is handled by now
        counts = [int(v) for v in (await client.hgetall(key)).values()]
    finally:
        stop_child(proc)
        await client.delete(key)
        await client.aclose()
        await drop_namespace(settings)
    twice = sum(1 for c in counts if c > 1)
    return Redelivery(records, killed_at, twice, sum(c - 1 for c in counts), records - len(counts))


def median_of(runs: list[Throughput]) -> dict[str, Any]:
    """The median run by records/s and by CPU per record, with the range of each."""
    rates = sorted(r.records_per_s for r in runs)
    cpus = sorted(r.cpu_us_per_record for r in runs)
    return {
        "records_per_s": statistics.median(rates),
        "records_per_s_range": [rates[0], rates[-1]],
        "cpu_us_per_record": statistics.median(cpus),
        "cpu_us_per_record_range": [cpus[0], cpus[-1]],
    }


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    engines = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    rate = [results[e]["throughput"]["records_per_s"] for e in engines]
    cpu = [results[e]["throughput"]["cpu_us_per_record"] for e in engines]
    twice = [results[e]["redelivery"]["handled_twice"] for e in engines]
    lost = [results[e]["redelivery"]["lost"] for e in engines]
    axes[0].bar(engines, rate, color="#4c72b0")
    axes[0].set_title("records/s (higher is better)")
    axes[1].bar(engines, cpu, color="#dd8452")
    axes[1].set_title("CPU µs per record (lower is better)")
    x = range(len(engines))
    axes[2].bar([i - 0.2 for i in x], twice, width=0.4, label="handled twice", color="#55a868")
    axes[2].bar([i + 0.2 for i in x], lost, width=0.4, label="lost", color="#c44e52")
    axes[2].set_xticks(list(x), engines)
    axes[2].set_title("after a SIGKILL mid-batch")
    axes[2].legend()
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def verdicts(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    base = results["consumerloop"]["throughput"]
    out = {}
    for engine, r in results.items():
        if engine == "consumerloop":
            continue
        rate = r["throughput"]["records_per_s"] / base["records_per_s"]
        cpu = r["throughput"]["cpu_us_per_record"] / base["cpu_us_per_record"]
        lost = r["redelivery"]["lost"]
        ok = rate >= 0.9 and cpu <= 1.1 and lost == 0
        verdict = "matches" if ok else "does not match"
        out[engine] = f"{verdict}: {rate:.2f}x the records/s, {cpu:.2f}x the CPU per record, {lost} lost"
    return out


def write_markdown(report: dict[str, Any], path: Path) -> None:
    results = report["results"]
    lines = [
        "# FastStream 0.7 against ConsumerLoop, the same handler",
        "",
        f"Command: `{report['command']}` ({report['seconds']:.0f} s; {report['machine']}; load average "
        f"{report['load_average'][0]} before, {report['load_average'][1]} after: the engines ran one after another).",
        f"FastStream {report['versions']['faststream']}, faststream-concurrent-aiokafka "
        f"{report['versions']['faststream-concurrent-aiokafka']}, aiokafka {report['versions']['aiokafka']}.",
        "",
        "The handler applies its effect in Redis (a count per record id) and publishes a derived record through",
        "llmbus's Publisher, acknowledged, before the engine commits; each engine runs in its own process on",
        f"uvloop, {PARTITIONS} partitions, concurrency {report['concurrency']} where the engine has it. Throughput:",
        f"{report['records']} records waiting, {report['repeat']} runs per engine interleaved (median, and the",
        f"range); SIGKILL: {report['kill_records']} records, the process killed once a third are handled and",
        "started again in the same group.",
        "",
        "| engine | records/s | CPU µs/record | handled when killed | handled twice | lost |",
        "|---|---|---|---|---|---|",
    ]
    for engine, r in results.items():
        tp, rd = r["throughput"], r["redelivery"]
        rate = f"{tp['records_per_s']:,.0f} ({tp['records_per_s_range'][0]:,}-{tp['records_per_s_range'][1]:,})"
        cpu = f"{tp['cpu_us_per_record']:,.0f} ({tp['cpu_us_per_record_range'][0]}-{tp['cpu_us_per_record_range'][1]})"
        lines.append(
            f"| {engine} | {rate} | {cpu} | {rd['handled_when_killed']:,} | {rd['handled_twice']:,} | {rd['lost']:,} |"
        )
    lines += ["", "Against the pass criteria (at least 0.9x the records/s, at most 1.1x the CPU, none lost):", ""]
    lines += [f"- {engine}: {verdict}" for engine, verdict in report["verdicts"].items()]
    lines += ["", "![records/s, CPU per record, redelivery](runtime_engine.png)", ""]
    path.write_text("\n".join(lines))


async def parent(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    import aiokafka

    started, load_before = time.monotonic(), os.getloadavg()[0]
    runs: dict[str, list[Throughput]] = {engine: [] for engine in args.engines}
    for repeat in range(args.repeat):  # interleaved: a shared machine's load changes over minutes
        for engine in args.engines:
            log(f"{engine}: throughput over {args.records} records ({repeat + 1} of {args.repeat})")
            runs[engine].append(await throughput(engine, args.records, args.concurrency))
            log(f"{engine}: {runs[engine][-1]}")
    results: dict[str, dict[str, Any]] = {}
    for engine in args.engines:
        log(f"{engine}: SIGKILL over {args.kill_records} records")
        rd = await redelivery(engine, args.kill_records, args.concurrency)
        log(f"{engine}: {rd}")
        results[engine] = {"throughput": median_of(runs[engine]), "runs": [asdict(r) for r in runs[engine]]}
        results[engine]["redelivery"] = asdict(rd)
    report = {
        "command": " ".join([COMMAND, *sys.argv[1:]]),
        "seconds": round(time.monotonic() - started, 1),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],  # a shared machine: before, after
        "versions": {
            "faststream": version("faststream"),
            "faststream-concurrent-aiokafka": version("faststream-concurrent-aiokafka"),
            "aiokafka": aiokafka.__version__,
        },
        "records": args.records,
        "repeat": args.repeat,
        "kill_records": args.kill_records,
        "concurrency": args.concurrency,
        "results": results,
        "verdicts": verdicts(results) if "consumerloop" in results else {},
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "runtime_engine.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, REPORTS / "runtime_engine.md")
    plot(results, REPORTS / "runtime_engine.png")
    log(f"done in {report['seconds']} s: bench/reports/runtime_engine.{{json,md,png}}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--kill-records", type=int, default=4_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs per engine (the median is reported)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.prefix, args.concurrency)
    else:
        asyncio.run(parent(args))


if __name__ == "__main__":
    main()
