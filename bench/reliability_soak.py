"""Soak: the stack under steady load for a long time; memory, Redis keys and consumer lag over time.

router → scheduler → 2 sim workers on the real broker and Redis (a fresh namespace). First the
sustained maximum is measured (a closed loop of 64 requests in flight for --probe-s seconds),
then the load runs open-loop at --load-share of it for --minutes. Every --sample-s the RSS of
every service process (children included), the namespace's Redis key count and the lag of every
consumer group are recorded. Pass: RSS growth under 10 % after the warm-up (median of the last
fifth of the samples after it against the median of their first fifth) and every group's lag
back to 0 after the load; the delivery audit over the whole run is reported beside it.

The warm-up is --warmup-min (12) or a fifth of the run, whichever is longer: the caches the
services bound by time fill for that long (the scheduler's prefix index keeps what the last
10 minutes placed) and then hold steady, which is not a leak. A run too short to leave ten
samples after the warm-up is reported with its memory not judged. `--judge FILE` judges the
samples of an earlier run again (no new measurement) and rewrites its report.

    python -m bench.reliability_soak [--minutes 30] [--load-share 0.5] [--rate-per-s R] [--warmup-min 12]
    python -m bench.reliability_soak --judge bench/reports/soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer

from llmbus.audit import audit_namespace
from llmbus.bus.admin import open_admin
from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.reliability.stack import Answers, Load, Stack, make_request, prepare, start_and_wait
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings

REPORTS = Path(__file__).resolve().parent / "reports"
WORKERS = ["w1", "w2"]
GROWTH_LIMIT = 0.10
WARMUP_MIN = 12.0  # longer than the longest time-bounded cache (the scheduler's prefix index: 10 min)


def rss_bytes(pid: int) -> int:
    try:
        proc = psutil.Process(pid)
        return proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(recursive=True))
    except psutil.NoSuchProcess:
        return 0


async def redis_keys(settings: BusSettings) -> int:
    client = redis_client(settings.redis_url)
    try:
        count = 0
        async for _ in client.scan_iter(match=f"llmbus:{settings.topic_prefix}*", count=1000):
            count += 1
        return count
    finally:
        await client.aclose()


def groups_of(settings: BusSettings, stack: Stack) -> list[str]:
    topics = t.Topics(settings.topic_prefix)
    groups = [topics.group(t.ROUTER), topics.group(t.ROUTER, "results"), topics.group(t.SCHEDULER)]
    groups += [topics.group(t.SCHEDULER, f"outcomes.{settings.topic_prefix}scheduler")]
    return groups + [topics.group(t.WORKER, w) for w in WORKERS]


async def consumer_lag(settings: BusSettings, groups: list[str], ends_reader: AIOKafkaConsumer) -> dict[str, int]:
    lag: dict[str, int] = {}
    async with open_admin(settings) as admin:
        for group in groups:
            committed = await asyncio.wait_for(admin.list_consumer_group_offsets(group), settings.admin_timeout_s)
            if not committed:
                lag[group] = 0
                continue
            ends = await asyncio.wait_for(ends_reader.end_offsets(list(committed)), settings.admin_timeout_s)
            lag[group] = sum(max(0, ends[tp] - meta.offset) for tp, meta in committed.items())
    return lag


async def sample(settings: BusSettings, stack: Stack, ends_reader: AIOKafkaConsumer, started: float) -> dict:
    return {
        "t_s": round(time.monotonic() - started, 1),
        "rss_mib": {n: round(rss_bytes(pid) / 2**20, 1) for n, pid in stack.pids().items()},
        "redis_keys": await redis_keys(settings),
        "lag": await consumer_lag(settings, groups_of(settings, stack), ends_reader),
    }


async def probe_max_rate(settings: BusSettings, seconds: float, in_flight: int = 64) -> float:
    """Answers per second with `in_flight` requests always outstanding (a closed loop)."""
    done = 0
    rng = random.Random(1)
    async with LlmbusClient(settings) as client:
        deadline = time.monotonic() + seconds
        counter = iter(range(10**9))

        async def one_stream() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                request = make_request(next(counter) * 10 + 1, rng)  # never the cached kind
                async for chunk in client.stream(request, timeout_s=60):
                    if chunk.final:
                        done += 1
                        break

        started = time.monotonic()
        await asyncio.gather(*[one_stream() for _ in range(in_flight)])
        return done / (time.monotonic() - started)


def growth(series: list[float]) -> float | None:
    """Median of the last fifth over the median of the first fifth, minus 1 (None: under 10 samples)."""
    n = len(series)
    if n < 10:
        return None
    early = statistics.median(series[: n // 5])
    late = statistics.median(series[4 * n // 5 :])
    return late / early - 1 if early else 0.0


def judge(result: dict, warmup_min: float) -> dict:
    """The verdict over a run's samples: RSS growth after the warm-up, lag after the load, the audit."""
    samples = result["samples"]
    load_end_s = result["minutes"] * 60
    warmup_s = max(warmup_min * 60, load_end_s / 5)
    steady = [s for s in samples if warmup_s <= s["t_s"] <= load_end_s]
    rss_growth = {}
    for name in samples[0]["rss_mib"]:
        g = growth([s["rss_mib"][name] for s in steady if name in s["rss_mib"]])
        rss_growth[name] = None if g is None else round(g, 4)
    memory_ok = all(g is not None and g < GROWTH_LIMIT for g in rss_growth.values())
    return result | {
        "warmup_s": warmup_s,
        "rss_growth": rss_growth,
        "memory_judged": all(g is not None for g in rss_growth.values()),
        "passed": result["audit"]["passed"] and memory_ok and not any(result["final_lag"].values()),
    }


async def run(minutes: float, load_share: float, rate_per_s: float | None, probe_s: float, sample_s: float) -> dict:
    settings = fresh_settings()
    await prepare(settings)
    log_dir = Path("/tmp") / f"{settings.topic_prefix}soak"
    log_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(settings, log_dir)
    stack.router()
    stack.scheduler()
    for worker_id in WORKERS:
        stack.worker(worker_id)
    supervisor = asyncio.create_task(stack.supervise())
    ends_reader = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await ends_reader.start()
    samples: list[dict] = []
    try:
        await start_and_wait(stack, WORKERS)
        measured = None
        if rate_per_s is None:
            print(f"probing the sustained maximum for {probe_s:.0f}s", file=sys.stderr)
            measured = await probe_max_rate(settings, probe_s)
            rate_per_s = max(1.0, measured * load_share)
        print(f"soak: {minutes} min at {rate_per_s:.1f} req/s", file=sys.stderr)
        answers = await Answers(settings).start()
        started = time.monotonic()
        load = Load(settings, int(rate_per_s * minutes * 60), rate_per_s, seed=11)
        sending = asyncio.create_task(load.run())
        while not sending.done():
            samples.append(await sample(settings, stack, ends_reader, started))
            last = samples[-1]
            print(
                f"  t={last['t_s']}s sent={len(load.sent_ids)} rss={last['rss_mib']} lag={last['lag']}", file=sys.stderr
            )
            await asyncio.wait({sending}, timeout=sample_s)
        sent = sending.result()
        drain_deadline = time.monotonic() + 120
        while time.monotonic() < drain_deadline:
            samples.append(await sample(settings, stack, ends_reader, started))
            if not any(samples[-1]["lag"].values()):
                break
            await asyncio.sleep(2)
        answered = await answers.wait(sent, timeout_s=60)
        await answers.stop()
        report = await audit_namespace(settings, sent, timeout_s=600)
    finally:
        supervisor.cancel()
        await ends_reader.stop()
        stack.stop_all()
        await drop_namespace(settings)
    final_lag = samples[-1]["lag"]
    return {
        "minutes": minutes,
        "measured_max_per_s": round(measured, 1) if measured else None,
        "rate_per_s": round(rate_per_s, 1),
        "sent": len(sent),
        "answered": answered,
        "audit": report.counts() | {"passed": report.passed},
        "final_lag": final_lag,
        "restarts": stack.crashes,
        "samples": samples,
    }


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    xs = [s["t_s"] / 60 for s in samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for name in samples[0]["rss_mib"]:
        axes[0].plot(xs, [s["rss_mib"].get(name) for s in samples], label=name)
    axes[0].axvline(result["warmup_s"] / 60, color="grey", linestyle=":", label="end of warm-up")
    axes[0].set_ylabel("RSS (MiB)")
    axes[0].legend(fontsize=8)
    axes[1].plot(xs, [s["redis_keys"] for s in samples])
    axes[1].set_ylabel("Redis keys (namespace)")
    for group in samples[0]["lag"]:
        axes[2].plot(xs, [s["lag"].get(group, 0) for s in samples], label=group.rsplit("llmbus.", 1)[-1])
    axes[2].set_ylabel("consumer lag (records)")
    axes[2].set_xlabel("minutes")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"soak: {result['minutes']} min at {result['rate_per_s']} req/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_report(result: dict, out: str) -> list[str]:
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, REPORTS / f"{out}.png")
    growth_line = ", ".join(
        f"{name} {'not judged' if g is None else f'{g:+.1%}'}" for name, g in result["rss_growth"].items()
    )
    lines = [
        "# Soak",
        "",
        f"Command: `{result['command']}`",
        *([f"Judged again (the same samples): `{result['judged_by']}`"] if result.get("judged_by") else []),
        "",
        f"- {result['minutes']} min at {result['rate_per_s']} req/s"
        + (f" (half of the measured {result['measured_max_per_s']} req/s)" if result["measured_max_per_s"] else ""),
        f"- sent {result['sent']}, answered {result['answered']}; audit: {result['audit']}",
        f"- RSS growth after the {result['warmup_s'] / 60:.0f}-minute warm-up (last fifth vs first fifth of the"
        f" samples after it): {growth_line} (limit {GROWTH_LIMIT:.0%})",
        f"- consumer lag after the load: {result['final_lag']}",
        f"- services restarted after exiting by themselves: {result['restarts'] or 'none'}",
        f"- verdict: {'pass' if result['passed'] else 'FAIL'}"
        + ("" if result["memory_judged"] else " (memory not judged: too few samples after the warm-up)"),
        "",
        f"![soak]({out}.png)",
    ]
    (REPORTS / f"{out}.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--load-share", type=float, default=0.5, help="share of the measured sustained maximum")
    parser.add_argument("--rate-per-s", type=float, default=None, help="fixed rate instead of a measured share")
    parser.add_argument("--probe-s", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--warmup-min", type=float, default=WARMUP_MIN)
    parser.add_argument("--judge", type=Path, default=None, help="an earlier run's JSON: judge its samples again")
    parser.add_argument("--out", default="soak")
    args = parser.parse_args()
    command = shlex.join(["python", "-m", "bench.reliability_soak", *sys.argv[1:]])
    if args.judge is not None:
        result = json.loads(args.judge.read_text()) | {"judged_by": command}
    else:
        measured = asyncio.run(run(args.minutes, args.load_share, args.rate_per_s, args.probe_s, args.sample_s))
        result = {"command": command, **measured}
    result = judge(result, args.warmup_min)
    lines = write_report(result, args.out)
    print("\n".join(lines))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
