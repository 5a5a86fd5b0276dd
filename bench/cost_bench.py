"""Cost-accounting throughput: results costed per second on one core, replaying a backlog.

Two measurements, side by side in one run:
  core     the pure path the service runs per result, in this process on one core: decode the
           InferenceResult JSON, price it (hosted / cache / shadow) or add it to the GPU ledger
           (self-hosted), close the ledger's intervals, encode the CostRecords. No I/O.
  service  the service (the bus runtime) in this process against the real Kafka and Redis: a backlog of
           N results already on llm.results (none of it held in this process), the service started,
           the clock stops when every result has been billed once and every CostRecord applied to
           the aggregates (Redis dedupe, outbox, atomic aggregate scripts, budgets, the ledger's
           interval closes included). CPU seconds are this process's, start-up included (and
           reported apart); Kafka's and Redis's own CPU is not counted.

    python -m bench.cost_bench [--results 100000] [--service-results 20000] [--baseline REF --rounds 2]

With --baseline, the service is measured with the code of git ref REF and with the current code,
alternately, each run in a fresh process (same backlog, same machine, same minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmbus.contract.messages import (
    CostRecord,
    InferenceResult,
    ResultStatus,
    Timings,
    Usage,
    WorkerState,
    WorkerStatus,
    now_ms,
)
from llmbus.process.launch import checkout_pythonpath
from llmbus_services.cost_accounting.core.costing import ServedRequest, price_result
from llmbus_services.cost_accounting.core.gpu_ledger import GpuLedger
from llmbus_services.cost_accounting.core.prices import load_pricebook

REPORTS = Path(__file__).resolve().parent / "reports"
WORKERS = [f"bench-w{i}" for i in range(4)]


def backlog(n: int, t0_ms: int, span_ms: int, seed: int = 7) -> list[InferenceResult]:
    """A mix like a day's traffic: 55 % hosted, 25 % self-hosted, 12 % cache hits, 5 % shadow, 3 % refused."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        done = t0_ms + int(span_ms * i / n)
        prompt, completion = rng.randint(50, 4000), rng.randint(10, 800)
        r = rng.random()
        fields: dict[str, object] = {
            "request_id": f"bench-{i}",
            "tenant": f"tenant-{rng.randint(0, 49)}",
            "status": ResultStatus.OK,
            "usage": Usage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=prompt // 4),
            "completed_at_ms": done,
            "route_reason": "default",
        }
        if r < 0.55:
            fields["model"] = rng.choice(["gpt-4.1", "gpt-4.1-mini"])
        elif r < 0.80:
            fields |= {"model": "sim-llama-8b", "worker_id": rng.choice(WORKERS)}
            fields["timings"] = Timings(engine_ms=float(rng.randint(200, 20_000)))
        elif r < 0.92:
            fields |= {"model": "gpt-4.1-mini", "cached": True}
        elif r < 0.97:
            fields |= {"model": "gpt-4.1", "shadow": True, "experiment_id": "exp-bench", "variant": "cand"}
        else:
            fields |= {"status": ResultStatus.ERROR, "usage": Usage(), "model": "gpt-4.1"}
        out.append(InferenceResult.model_validate(fields))
    return out


def heartbeats(t0_ms: int, sent_ms: int, state: WorkerState = WorkerState.READY) -> list[WorkerStatus]:
    return [
        WorkerStatus(
            worker_id=w,
            node_id="bench",
            state=state,
            engine="sim",
            models=["sim-llama-8b"],
            cold_start_s=20.0,
            started_at_ms=t0_ms - 60_000,
            sent_at_ms=sent_ms,
        )
        for w in WORKERS
    ]


def bench_core(raw: list[bytes], t0_ms: int, span_ms: int) -> dict[str, float]:
    book = load_pricebook()
    ledger = GpuLedger(book, interval_ms=60_000, grace_ms=30_000)
    for status in heartbeats(t0_ms, t0_ms):
        ledger.observe(status)
    records = 0
    step = max(1, len(raw) // 200)  # heartbeats advance the workers' clocks 200 times over the backlog
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i, payload in enumerate(raw):
        result = InferenceResult.model_validate_json(payload)
        priced = price_result(result, book)
        out: list[CostRecord] = ledger.add(priced) if isinstance(priced, ServedRequest) else [priced]
        records += sum(len(r.to_bytes()) > 0 for r in out)
        if i % step == 0:
            for status in heartbeats(t0_ms, result.completed_at_ms):
                ledger.observe(status)
            records += sum(len(r.to_bytes()) > 0 for r in ledger.close(result.completed_at_ms))
    for status in heartbeats(t0_ms, t0_ms + span_ms, WorkerState.STOPPED):
        ledger.observe(status)
    records += sum(len(r.to_bytes()) > 0 for r in ledger.close(t0_ms + span_ms + 120_000))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {
        "results": len(raw),
        "records": records,
        "wall_s": wall,
        "cpu_s": cpu,
        "results_per_s": len(raw) / wall,
        "cpu_us_per_result": cpu / len(raw) * 1e6,
        "late_results": ledger.late_results,
    }


async def bench_service(n: int, t0_ms: int, span_ms: int) -> dict[str, float]:
    from llmbus.bus.admin import ensure_catalog
    from llmbus.bus.producer import make_producer
    from llmbus.contract import topics as t
    from llmbus_services.cost_accounting.app import CostService
    from llmbus_services.cost_accounting.config import CostSettings
    from llmbus_services.cost_accounting.core.aggregates import agg_key, read_totals
    from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings

    settings = fresh_settings()
    await ensure_catalog(settings)
    topics = t.Topics(settings.topic_prefix)
    producer = make_producer(settings, "cost-bench")
    await producer.start()
    try:
        for status in heartbeats(t0_ms, now_ms()):
            await producer.send(topics.name(t.WORKERS), status.to_bytes(), key=status.worker_id.encode())
        days: set[str] = set()
        for i, r in enumerate(backlog(n, t0_ms, span_ms, seed=11)):
            await producer.send(topics.name(t.RESULTS), r.to_bytes(), key=r.request_id.encode())
            days.add(agg_key(settings.topic_prefix, "day", r.completed_at_ms, "total"))
            if i % 5000 == 0:
                print(f"  backlog {i}/{n}", file=sys.stderr)
        await asyncio.wait_for(producer.flush(), 60)
    except BaseException:
        await producer.stop()
        raise
    # The backlog is on Kafka, not in this process: the service's heap is its own (a garbage
    # collection would otherwise walk tens of thousands of the bench's objects on every full pass).
    gc.collect()
    service = CostService(settings, CostSettings(grace_s=0.5, worker_expiry_s=30, close_every_s=0.2))
    redis_cpu0 = await _redis_cpu_s(service.redis)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await service.start()
    started_cpu_s = time.process_time() - cpu0  # connecting, reading the tables, restoring: once per run
    load_at_start = os.getloadavg()[0]
    requests_billed = 0
    try:
        # the workers stop once the backlog is read: their last intervals close, their requests are billed
        while _results_seen() < n and time.perf_counter() - wall0 < 600:
            await asyncio.sleep(0.2)
        stage1_s = time.perf_counter() - wall0
        for status in heartbeats(t0_ms, now_ms(), WorkerState.STOPPED):
            await producer.send(topics.name(t.WORKERS), status.to_bytes(), key=status.worker_id.encode())
        await asyncio.wait_for(producer.flush(), 60)
        await producer.stop()
        while time.perf_counter() - wall0 < 600:
            requests_billed = 0
            for key in days:
                requests_billed += read_totals(await service.store.totals(key)).get("all", {}).get("requests", 0)
            if requests_billed >= n:
                break
            print(f"  billed {requests_billed}/{n}", file=sys.stderr)
            await asyncio.sleep(1.0)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        redis_cpu = await _redis_cpu_s(service.redis) - redis_cpu0
    finally:
        await service.stop()
        await _drop_keys(settings)
        await drop_namespace(settings)
    return {
        "results": n,
        "billed": requests_billed,
        "wall_s": wall,
        "cpu_s": cpu,
        "read_and_priced_s": stage1_s,  # every result read, priced or held (the workers still running)
        "start_cpu_s": started_cpu_s,
        "late_results": _late_results(),  # self-hosted results read after their interval closed
        "load_1m_at_start": load_at_start,
        # the shared Redis server's CPU over the run: other clients' work is in it too
        "redis_cpu_us_per_result": redis_cpu / n * 1e6,
        "cpu_us_per_result_after_start": (cpu - started_cpu_s) / n * 1e6,
        "results_per_s": n / wall,
        "cpu_us_per_result": cpu / n * 1e6,
    }


async def _redis_cpu_s(client) -> float:  # type: ignore[no-untyped-def]
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _reference_loop() -> float:
    started = time.process_time()
    sum(range(10_000_000))
    return time.process_time() - started


def _late_results() -> float:
    from llmbus_services.cost_accounting.adapters.metrics import LATE_RESULTS

    return sum(s.value for m in LATE_RESULTS.collect() for s in m.samples if s.name.endswith("_total"))


def _results_seen() -> float:
    from llmbus_services.cost_accounting.adapters.metrics import RESULTS

    return sum(
        sample.value for metric in RESULTS.collect() for sample in metric.samples if sample.name.endswith("_total")
    )


async def _drop_keys(settings) -> None:  # type: ignore[no-untyped-def]
    from llmbus.state.store import redis_client

    client = redis_client(settings.redis_url)
    async for key in client.scan_iter(match=f"{settings.topic_prefix}*", count=1000):
        await client.delete(key)
    await client.aclose()


def _service_in_subprocess(tree: Path, n: int, batch: int | None) -> dict[str, float]:
    """One service measurement in a fresh process whose `llmbus_services` and `llmbus` come from `tree`."""
    env = os.environ | {"PYTHONPATH": checkout_pythonpath(tree)}
    if batch:
        env["LLMBUS_COST_BATCH_MAX_RECORDS"] = str(batch)
    command = [sys.executable, str(Path(__file__).resolve()), "--service-only", str(n)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"service run in {tree} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _export_tree(ref: str, into: Path) -> Path:
    """The repository as of `ref` (git archive), to run the old service code beside the new."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(repo), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def side_by_side(baseline_ref: str, n: int, rounds: int, batch: int | None) -> dict[str, Any]:
    """Old (baseline_ref) and current service code measured alternately, each round in fresh processes."""
    repo = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="cost-bench-baseline-") as tmp:
        old_tree = _export_tree(baseline_ref, Path(tmp))
        for i in range(rounds):
            for name, tree in (("baseline", old_tree), ("current", repo)):
                print(f"  round {i + 1}/{rounds}: {name} service over {n} results ...", file=sys.stderr)
                runs[name].append(_service_in_subprocess(tree, n, batch))
                print(f"    {json.dumps(runs[name][-1])}", file=sys.stderr)
    return {"baseline_ref": baseline_ref, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", type=int, default=100_000)
    parser.add_argument("--service-results", type=int, default=20_000)
    parser.add_argument("--no-service", action="store_true", help="only the core path (no Kafka/Redis)")
    parser.add_argument("--baseline", default=None, help="git ref of the old service code, measured alternately")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of old + current (with --baseline)")
    parser.add_argument("--batch", type=int, default=None, help="LLMBUS_COST_BATCH_MAX_RECORDS for both")
    parser.add_argument("--service-only", type=int, default=None, help=argparse.SUPPRESS)  # one subprocess run
    args = parser.parse_args()
    if args.service_only is not None:
        recent = now_ms() - 600_000
        measured = asyncio.run(bench_service(args.service_only, recent, 300_000))
        print(json.dumps(measured))
        return
    # here, not at the top: a --service-only run may have an older tree's `bench` on its path
    from bench.cost_report import markdown, plot

    span_ms = 3_600_000
    t0 = now_ms() - now_ms() % 3_600_000 - 2 * span_ms
    raw = [r.to_bytes() for r in backlog(args.results, t0, span_ms)]
    print(f"core path over {len(raw)} results ...", file=sys.stderr)
    core = bench_core(raw, t0, span_ms)
    print(json.dumps(core), file=sys.stderr)
    service: dict[str, Any] | None = None
    if not args.no_service:
        if args.baseline:
            service = side_by_side(args.baseline, args.service_results, args.rounds, args.batch)
        else:
            service = {
                "runs": {"current": [_service_in_subprocess(REPORTS.parent.parent, args.service_results, args.batch)]}
            }
    command = "python -m bench.cost_bench " + " ".join(sys.argv[1:])
    load1, load5, _ = os.getloadavg()
    report: dict[str, Any] = {
        "command": command.strip(),
        "core": core,
        "service": service,
        "reference_loop_cpu_s": _reference_loop(),
        "load_average_1m_5m": [load1, load5],
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "cost_bench.json").write_text(json.dumps(report, indent=2))
    if service and "baseline" in service["runs"]:
        plot(report, REPORTS / "cost_bench.png")
    lines = markdown(report)
    (REPORTS / "cost_bench.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
