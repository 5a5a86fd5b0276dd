"""Soak: the stack under steady load for a long time; memory, Redis keys and consumer lag over time.

gateway → router → scheduler → 2 sim workers, and cost-accounting, on the real broker and Redis
(a fresh namespace). First the sustained maximum is measured (a closed loop of 64 requests in
flight for --probe-s seconds, on Kafka), then the load runs open-loop at --load-share of it for
--minutes: --http-share of it (25 %) as streamed OpenAI chat completions over HTTP through the
gateway (httpx, one gateway API key per tenant), the rest published on llm.requests. Every
--sample-s the RSS of every service process (gateway and cost-accounting included, children
included), the namespace's Redis key count and the lag of every consumer group (cost-accounting's
included; the gateway reads its replies without a group) are recorded.

The criterion, fixed before the run; it passes only if all hold:
- RSS growth under 10 % for every service after the warm-up (median of the last fifth of the
  samples after it against the median of their first fifth);
- every consumer group's lag back to 0 after the load;
- the delivery audit over the whole run passes (every request sent on Kafka and every request
  the gateway accepted answered exactly once, no bad chunks);
- every HTTP request gets a 200 and a complete streamed answer (a chunk with a finish_reason,
  then [DONE], no error event); any other outcome counts as lost, and none may be lost;
- cost-accounting bills every result exactly once, the gateway's requests included
  (`llmbus_tools.harness.reliability.effects.Billing`: results billed once == results answered,
  none unbilled, no record doubled, none extra, Redis tenant totals agree with llm.costs).

The warm-up is --warmup-min (12) or a fifth of the run, whichever is longer: the caches the
services bound by time fill for that long (the scheduler's prefix index keeps what the last
10 minutes placed) and then hold steady, which is not a leak. A run too short to leave ten
samples after the warm-up is reported with its memory not judged. `--judge FILE` judges the
samples of an earlier run again (no new measurement) and rewrites its report.

A run saved before the gateway and billing were part of the soak has neither measured: judged
again, it fails for that reason (said in its report).

    python -m bench.reliability_soak [--minutes 30] [--load-share 0.5] [--rate-per-s R] [--warmup-min 12]
        [--http-share 0.25] [--out soak] [--out-dir bench/reports]
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

import httpx
import psutil
from aiokafka import AIOKafkaConsumer

from llmbus.audit import audit, read_namespace
from llmbus.audit.bills import check_bills
from llmbus.bus.admin import open_admin
from llmbus.client import LlmbusClient
from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus.state.store import redis_client
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.deployment import TENANTS, Deployment
from llmbus_tools.harness.reliability.effects import Billing, costs_in, group_members, results_in
from llmbus_tools.harness.reliability.gateway import api_keys, wait_ready
from llmbus_tools.harness.reliability.load import MODEL, Answers, Load, make_request
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings

REPORTS = Path(__file__).resolve().parent / "reports"
WORKERS = ["w1", "w2"]
GROWTH_LIMIT = 0.10
WARMUP_MIN = 12.0  # longer than the longest time-bounded cache (the scheduler's prefix index: 10 min)
HTTP_SHARE = 0.25
HTTP_SEED = 13  # the HTTP requests' own draw (the Kafka load's is 11)


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
    groups += [topics.group(t.COST, "results"), topics.group(t.COST, "scaling")]  # the gateway has none
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


async def sample(
    settings: BusSettings,
    stack: Stack,
    ends_reader: AIOKafkaConsumer,
    started: float,
    http: ChatLoad,
    billing: Billing,
) -> dict:
    await billing.settle(set(), 0)  # reads what llm.costs has so far (about 2 s)
    return {
        "t_s": round(time.monotonic() - started, 1),
        "rss_mib": {n: round(rss_bytes(pid) / 2**20, 1) for n, pid in stack.pids().items()},
        "redis_keys": await redis_keys(settings),
        "lag": await consumer_lag(settings, groups_of(settings, stack), ends_reader),
        "http": {"sent": http.sent, "complete": http.complete, "lost": sum(http.lost.values())},
        "billed": len(billing.billed),
    }


async def wait_group(settings: BusSettings, group: str, timeout_s: float = 120) -> None:
    """Until somebody holds `group` (cost-accounting consumes llm.results before the load starts)."""
    deadline = time.monotonic() + timeout_s
    while not await group_members(settings, group):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody joined {group} within {timeout_s}s")
        await asyncio.sleep(0.5)


class ChatLoad:
    """Streamed chat completions through the gateway at a fixed rate, each its own HTTP request.
    `complete`: 200, a chunk with a finish_reason, then [DONE], no error event; anything else is
    lost, by why (HTTP status, error event, no [DONE], exception name)."""

    def __init__(self, base_url: str, keys: dict[str, str], requests: int, rate_per_s: float) -> None:
        self.base_url = base_url
        self.keys = keys
        self.requests = requests
        self.rate_per_s = rate_per_s
        self.sent = 0
        self.accepted: list[str] = []  # x-request-id of every 200: the audit judges these by id
        self.complete = 0
        self.lost: dict[str, int] = {}

    def _lose(self, why: str) -> None:
        self.lost[why] = self.lost.get(why, 0) + 1

    async def _one(self, http: httpx.AsyncClient, i: int, rng: random.Random) -> None:
        request = make_request(i, rng, TENANTS)
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": request.prompt}],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
        }
        headers = {"Authorization": f"Bearer {self.keys[request.tenant]}"}
        url = f"{self.base_url}/v1/chat/completions"
        try:
            async with http.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code != 200:
                    return self._lose(f"HTTP {response.status_code}")
                self.accepted.append(response.headers["x-request-id"])
                finished = False
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        if finished:
                            self.complete += 1
                            return None
                        return self._lose("[DONE] without a finish_reason")
                    if line.startswith("data: "):
                        event = json.loads(line.removeprefix("data: "))
                        if "error" in event:
                            return self._lose("error event")
                        finished |= any(c.get("finish_reason") for c in event.get("choices", []))
                return self._lose("stream ended without [DONE]")
        except httpx.HTTPError as exc:
            return self._lose(type(exc).__name__)

    async def run(self) -> None:
        rng = random.Random(HTTP_SEED)
        started = time.monotonic()
        tasks = []
        limits = httpx.Limits(max_connections=500, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=10), limits=limits) as http:
            for i in range(self.requests):
                tasks.append(asyncio.create_task(self._one(http, i, rng)))
                self.sent = i + 1
                behind_s = (i + 1) / self.rate_per_s - (time.monotonic() - started)
                if behind_s > 0:
                    await asyncio.sleep(behind_s)
            await asyncio.gather(*tasks)

    def summary(self) -> dict:
        return {
            "sent": self.sent,
            "accepted": len(self.accepted),
            "complete": self.complete,
            "lost": self.sent - self.complete,
            "lost_by_why": self.lost,
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
                request = make_request(next(counter) * 10 + 1, rng, TENANTS)  # never the cached kind
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
    """The verdict over a run's samples: RSS growth after the warm-up, lag after the load, the audit,
    every HTTP request answered completely, every result billed exactly once."""
    samples = result["samples"]
    load_end_s = result["minutes"] * 60
    warmup_s = max(warmup_min * 60, load_end_s / 5)
    steady = [s for s in samples if warmup_s <= s["t_s"] <= load_end_s]
    rss_growth = {}
    for name in samples[0]["rss_mib"]:
        g = growth([s["rss_mib"][name] for s in steady if name in s["rss_mib"]])
        rss_growth[name] = None if g is None else round(g, 4)
    memory_ok = all(g is not None and g < GROWTH_LIMIT for g in rss_growth.values())
    http, billing = result.get("http"), result.get("billing")
    http_ok = http is not None and http["sent"] > 0 and http["lost"] == 0
    billing_ok = billing is not None and not billing["problems"]
    return result | {
        "warmup_s": warmup_s,
        "rss_growth": rss_growth,
        "memory_judged": all(g is not None for g in rss_growth.values()),
        "http_ok": http_ok,
        "billing_ok": billing_ok,
        "passed": result["audit"]["passed"]
        and memory_ok
        and not any(result["final_lag"].values())
        and http_ok
        and billing_ok,
    }


async def run(
    minutes: float, load_share: float, rate_per_s: float | None, probe_s: float, sample_s: float, http_share: float
) -> dict:
    settings = fresh_settings()
    deployment = Deployment.plain(settings)  # the shared broker, without authentication
    await deployment.prepare()
    topics = t.Topics(settings.topic_prefix)
    log_dir = Path("/tmp") / f"{settings.topic_prefix}soak"
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    stack = Stack(deployment, log_dir)
    stack.router()
    stack.scheduler()
    for worker_id in WORKERS:
        stack.worker(worker_id)
    stack.cost()
    keys = await api_keys(settings, TENANTS)
    stack.gateway(port, f"{settings.topic_prefix}gw")
    supervisor = asyncio.create_task(stack.supervise())
    ends_reader = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None)
    await ends_reader.start()
    samples: list[dict] = []
    billing = None
    try:
        await stack.workers_ready(WORKERS)
        await wait_group(settings, topics.group(t.COST, "results"))
        await wait_ready(base_url)
        measured = None
        if rate_per_s is None:
            print(f"probing the sustained maximum for {probe_s:.0f}s", file=sys.stderr)
            measured = await probe_max_rate(settings, probe_s)
            rate_per_s = max(1.0, measured * load_share)
        http_rate = rate_per_s * http_share
        kafka_rate = rate_per_s - http_rate
        print(
            f"soak: {minutes} min at {rate_per_s:.1f} req/s ({kafka_rate:.1f} on Kafka, {http_rate:.1f} over HTTP)",
            file=sys.stderr,
        )
        answers = await Answers(deployment).start()
        billing = await Billing(settings).start()
        started = time.monotonic()
        load = Load(deployment, int(kafka_rate * minutes * 60), kafka_rate, seed=11)
        http = ChatLoad(base_url, keys, int(http_rate * minutes * 60), http_rate)
        sending = asyncio.gather(load.run(), http.run())
        while not sending.done():
            samples.append(await sample(settings, stack, ends_reader, started, http, billing))
            last = samples[-1]
            print(
                f"  t={last['t_s']}s sent={len(load.sent_ids)} http={last['http']} billed={last['billed']}"
                f" rss={last['rss_mib']} lag={last['lag']}",
                file=sys.stderr,
            )
            await asyncio.wait({sending}, timeout=sample_s)
        sent, _ = sending.result()
        drain_deadline = time.monotonic() + 120
        while time.monotonic() < drain_deadline:
            samples.append(await sample(settings, stack, ends_reader, started, http, billing))
            if not any(samples[-1]["lag"].values()):
                break
            await asyncio.sleep(2)
        all_ids = list(sent) + http.accepted  # the gateway's requests, by the id it answered with
        answered = await answers.wait(all_ids, timeout_s=60)
        await billing.settle(answers.seen & set(all_ids), 120)
        await answers.stop()
        records = await read_namespace(settings, 600)
        report = audit(topics, records, all_ids)
        bill_problems, bill_notes = await billing.check(records)
        bills = check_bills(costs_in(topics, records), results_in(topics, records), {})
    finally:
        supervisor.cancel()
        if billing is not None:
            await billing.stop()
        await ends_reader.stop()
        stack.stop_all()
        await drop_namespace(settings)
    final_lag = samples[-1]["lag"]
    return {
        "minutes": minutes,
        "measured_max_per_s": round(measured, 1) if measured else None,
        "rate_per_s": round(rate_per_s, 1),
        "http_share": http_share,
        "sent": len(all_ids),
        "sent_kafka": len(sent),
        "answered": answered,
        "audit": report.counts() | {"passed": report.passed},
        "http": http.summary(),
        "billing": {
            "results": bills.results,  # every result in the namespace (the rate probe's included)
            "billed_once": bills.billed,
            "unbilled": bills.unbilled,
            "doubled": bills.doubled,
            "extra": bills.extra,
            "problems": bill_problems,
            "notes": bill_notes,
        },
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
    fig, axes = plt.subplots(4, 1, figsize=(9, 12), sharex=True)
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
    axes[2].legend(fontsize=8)
    for key in ("sent", "complete", "lost"):
        axes[3].plot(xs, [s.get("http", {}).get(key, 0) for s in samples], label=f"HTTP {key}")
    axes[3].plot(
        xs, [s.get("billed", 0) for s in samples], label="cost records read on llm.costs (distinct request ids)"
    )
    axes[3].set_ylabel("requests (cumulative)")
    axes[3].set_xlabel("minutes")
    axes[3].legend(fontsize=8)
    fig.suptitle(f"soak: {result['minutes']} min at {result['rate_per_s']} req/s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write_report(result: dict, out: str, out_dir: Path = REPORTS) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{out}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out_dir / f"{out}.png")
    http, billing = result.get("http"), result.get("billing")
    http_line = (
        "not measured (a run from before the gateway was in the soak)"
        if http is None
        else f"{http['sent']} sent, {http['accepted']} accepted (200), {http['complete']} complete, "
        f"{http['lost']} lost {http['lost_by_why'] or ''}"
    )
    billing_line = (
        "not measured (a run from before cost-accounting was in the soak)"
        if billing is None
        else f"{billing['results']} results (the rate probe's included), {billing['billed_once']} billed exactly once,"
        f" {billing['unbilled']} unbilled, {billing['doubled']} doubled, {billing['extra']} extra;"
        f" problems: {billing['problems'] or 'none'}"
    )
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
        f"- sent {result['sent']} ({result.get('sent_kafka', result['sent'])} on Kafka, the rest accepted by the"
        f" gateway), answered {result['answered']}; audit: {result['audit']}",
        f"- HTTP through the gateway ({result.get('http_share', 0):.0%} of the load, streamed chat completions):"
        f" {http_line}",
        f"- billing (cost-accounting, every result exactly once): {billing_line}",
        f"- RSS growth after the {result['warmup_s'] / 60:.0f}-minute warm-up (last fifth vs first fifth of the"
        f" samples after it): {growth_line} (limit {GROWTH_LIMIT:.0%})",
        f"- consumer lag after the load: {result['final_lag']}",
        f"- services restarted after exiting by themselves: {result['restarts'] or 'none'}",
        f"- verdict: {'pass' if result['passed'] else 'FAIL'}"
        + ("" if result["memory_judged"] else " (memory not judged: too few samples after the warm-up)"),
        "",
        "Criterion (fixed before the run, in the module docstring): RSS growth under"
        f" {GROWTH_LIMIT:.0%} for every service after the warm-up; every consumer group's lag 0 after the load;"
        " the delivery audit passes; every HTTP request a 200 with a complete streamed answer (else lost, and"
        " none lost); every result billed exactly once (none unbilled, doubled or extra; Redis totals agree).",
        "",
        f"![soak]({out}.png)",
    ]
    (out_dir / f"{out}.md").write_text("\n".join(lines) + "\n")
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
    parser.add_argument("--http-share", type=float, default=HTTP_SHARE, help="share of the load sent over HTTP")
    parser.add_argument("--out", default="soak", help="report file names: OUT.md, OUT.json, OUT.png")
    parser.add_argument("--out-dir", type=Path, default=REPORTS)
    args = parser.parse_args()
    command = shlex.join(["python", "-m", "bench.reliability_soak", *sys.argv[1:]])
    if args.judge is not None:
        result = json.loads(args.judge.read_text()) | {"judged_by": command}
    else:
        measured = asyncio.run(
            run(args.minutes, args.load_share, args.rate_per_s, args.probe_s, args.sample_s, args.http_share)
        )
        result = {"command": command, **measured}
    result = judge(result, args.warmup_min)
    lines = write_report(result, args.out, args.out_dir)
    print("\n".join(lines))
    sys.exit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
