"""A short end-to-end check of the scheduler benchmark's ordering through the real broker.

    python -m bench.sched_e2e [--requests 200] [--workers 3] [--scale 4] [--speedup 4]

For each policy: a fresh topic namespace, the real scheduler process (LLMBUS_SCHEDULER_PIPELINE)
and N real sim engine-worker processes (SimCore, Llama-3.1-8B/H100 profile, `speedup` times
faster than real time). The test publishes RoutedRequests (prompts built from the Mooncake
trace's hash ids, arrivals compressed by scale x speedup) straight onto llm.routed and reads
the final results: TTFT (scaled back to simulated time) and cached prompt tokens. On two
CPU cores the processes share the machine with Kafka, so this is a sanity check of the
ordering, not the headline numbers (those come from bench.sched_bench).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.sched_bench import POLICIES, REPORTS, TRACE
from bench.sched_replay import prompt_text
from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult, RoutedRequest, WorkerState, WorkerStatus
from llmbus.process.launch import bus_env, spawn_module
from llmbus.settings import BusSettings
from llmbus_tools.harness.service_procs import drop_namespace, fresh_settings

REPO = Path(__file__).resolve().parents[1]
MODEL = "sim-llama-8b"


def spawn(module: str, settings: BusSettings, env: dict[str, str], log_name: str) -> subprocess.Popen[bytes]:
    log_path = Path(f"/tmp/{settings.topic_prefix}{log_name}.log")
    return spawn_module(module, env=os.environ | bus_env(settings) | env, log_path=log_path, cwd=REPO)


async def wait_ready(settings: BusSettings, n: int, timeout_s: float = 90) -> None:
    tail = TopicTail(settings, t.Topics(settings.topic_prefix).name(t.WORKERS))
    tail.consumer._auto_offset_reset = "earliest"
    await tail.start()
    ready: set[str] = set()
    try:
        async for record in tail.records(timeout_s):
            status = decode(record, WorkerStatus)
            if status.state == WorkerState.READY:
                ready.add(status.worker_id)
            if len(ready) >= n:
                return
    finally:
        await tail.stop()
    raise TimeoutError(f"only {len(ready)} of {n} workers ready")


async def run_policy(policy: str, rows: list[dict], args: argparse.Namespace) -> dict:
    settings = fresh_settings()
    await ensure_catalog(settings)
    procs = [
        spawn(
            "llmbus_services.scheduler",
            settings,
            {"LLMBUS_SCHEDULER_PIPELINE": policy, "LLMBUS_SCHEDULER_SEED": "0"},
            "scheduler",
        )
    ]
    for i in range(args.workers):
        procs.append(
            spawn(
                "llmbus_services.engine_worker",
                settings,
                {
                    "LLMBUS_WORKER_WORKER_ID": f"w{i}",
                    "LLMBUS_WORKER_MODEL": MODEL,
                    "LLMBUS_WORKER_SIM_SPEEDUP": str(args.speedup),
                    "LLMBUS_WORKER_SIM_MAX_MODEL_LEN": "131072",
                    "LLMBUS_WORKER_SIM_MAX_NUM_SEQS": "256",
                },
                f"w{i}",
            )
        )
    bus = await Bus.start(settings, "bench")
    results = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.RESULTS)).start()
    try:
        await wait_ready(settings, args.workers)
        await asyncio.sleep(2)  # the scheduler has heard every worker
        t0 = time.monotonic()
        compress = args.scale * args.speedup
        ids = set()
        for i, row in enumerate(rows):
            due = row["timestamp"] / 1000 / compress
            if (delay := due - (time.monotonic() - t0)) > 0:
                await asyncio.sleep(delay)
            request = InferenceRequest(
                request_id=f"{policy}-{i}",
                model=MODEL,
                temperature=0.0,
                prompt=prompt_text(row["input_length"], tuple(row["hash_ids"])),
                max_tokens=max(1, row["output_length"]),
            )
            await bus.publisher.publish(
                bus.topics.name(t.ROUTED),
                RoutedRequest(request=request, model=MODEL),
                key=MODEL,
                request_id=request.request_id,
            )
            ids.add(request.request_id)
        found: dict[str, InferenceResult] = {}
        async for record in results.records(args.timeout_s):
            result = decode(record, InferenceResult)
            if result.request_id in ids:
                found[result.request_id] = result
                if len(found) == len(ids):
                    break
    finally:
        await results.stop()
        await bus.stop()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        await drop_namespace(settings)
    ok = [r for r in found.values() if r.timings.ttft_ms is not None]
    ttft = np.array([r.timings.ttft_ms * args.speedup for r in ok])  # wall ms → simulated ms
    prompt = sum(r.usage.prompt_tokens for r in ok)
    return {
        "results": len(found),
        "requests": len(ids),
        "ttft_ms_simulated": {f"p{q}": float(np.percentile(ttft, q)) for q in (50, 90, 99)} if len(ttft) else {},
        "prefix_cache_hit_rate": sum(r.usage.cached_prompt_tokens for r in ok) / prompt if prompt else 0.0,
        "requests_per_worker": {
            w: sum(1 for r in ok if (r.worker_id or "?") == w) for w in sorted({r.worker_id or "?" for r in ok})
        },
        "errors": sorted({r.error.code.value for r in found.values() if r.error is not None}),
    }


async def amain(args: argparse.Namespace, rows: list[dict]) -> dict:
    out = {}
    for policy in POLICIES:
        t1 = time.time()
        out[policy] = await run_policy(policy, rows, args)
        print(f"{policy:<13} {json.dumps(out[policy])}  ({time.time() - t1:.0f}s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--scale", type=float, default=4.0)
    ap.add_argument("--speedup", type=float, default=4.0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.trace).read_text().splitlines()[: args.requests]]
    out = asyncio.run(amain(args, rows))
    report = {
        "command": "python -m bench.sched_e2e " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": vars(args),
        "results": out,
    }
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "sched_e2e.json").write_text(json.dumps(report, indent=2))
    lines = [
        "# Scheduler policies end to end through the real broker (sanity check)",
        "",
        f"Command: `{report['command']}`",
        "",
        (__doc__ or "").split("\n\n", 1)[1].strip(),
        "",
        "| policy | results | TTFT p50 ms (sim) | p90 | p99 | prefix hit | requests per worker | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for policy, r in out.items():
        q = r["ttft_ms_simulated"]
        lines.append(
            f"| {policy} | {r['results']}/{r['requests']} | {q.get('p50', 0):.0f} | {q.get('p90', 0):.0f} | "
            f"{q.get('p99', 0):.0f} | {r['prefix_cache_hit_rate']:.3f} | {r['requests_per_worker']} | "
            f"{r['errors'] or '-'} |"
        )
    (REPORTS / "sched_e2e.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {REPORTS / 'sched_e2e.json'} and .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
