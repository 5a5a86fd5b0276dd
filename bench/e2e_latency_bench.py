"""End-to-end latency of single requests through router → scheduler → sim worker on the real broker.

The sim engine is set to take no time (LLMBUS_WORKER_SIM_SPEEDUP=0), so what is measured
is the control plane: three Kafka hops in, the chunk and result hops out, and the
services' own work. Requests are sent one at a time (no queueing).

    python -m bench.e2e_latency_bench [--requests 200] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from llmbus.bus.admin import ensure_catalog
from llmbus.client import LlmbusClient
from llmbus.contract.messages import InferenceRequest
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready

REPORTS = Path(__file__).resolve().parent / "reports"


async def run(requests: int, max_tokens: int) -> dict[str, object]:
    settings = fresh_settings()
    await ensure_catalog(settings)
    procs = [
        ServiceProc("llmbus_services.router", settings).start(),
        ServiceProc("llmbus_services.scheduler", settings).start(),
        ServiceProc(
            "llmbus_services.engine_worker",
            settings,
            name="w1",
            env={"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_SIM_SPEEDUP": "0"},
        ).start(),
    ]
    try:
        await wait_workers_ready(settings, {"w1"})
        first_ms: list[float] = []
        final_ms: list[float] = []
        async with LlmbusClient(settings) as client:
            for i in range(requests + 10):
                request = InferenceRequest(prompt=f"latency probe {i}", model="sim-llama-8b", max_tokens=max_tokens)
                started = time.perf_counter()
                first = None
                async for chunk in client.stream(request, timeout_s=30):
                    if first is None and chunk.delta:
                        first = time.perf_counter()
                done = time.perf_counter()
                if i >= 10:  # the first few warm connections and caches up
                    first_ms.append((first - started) * 1000)
                    final_ms.append((done - started) * 1000)
                if i % 50 == 0:
                    print(f"  {i}/{requests + 10} requests", file=sys.stderr)
    finally:
        for proc in procs:
            proc.terminate(30)
        await drop_namespace(settings)

    def pct(values: list[float]) -> dict[str, float]:
        return {f"p{q}": round(float(np.percentile(values, q)), 2) for q in (50, 90, 99)} | {
            "mean": round(statistics.fmean(values), 2)
        }

    return {
        "requests": requests,
        "max_tokens": max_tokens,
        "sim_speedup": 0,
        "first_token_ms": pct(first_ms),
        "final_chunk_ms": pct(final_ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    report = asyncio.run(run(args.requests, args.max_tokens))
    command = f"python -m bench.e2e_latency_bench --requests {args.requests} --max-tokens {args.max_tokens}"
    report["command"] = command
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "e2e_latency.json").write_text(json.dumps(report, indent=2) + "\n")
    f, t = report["first_token_ms"], report["final_chunk_ms"]
    (REPORTS / "e2e_latency.md").write_text(
        "# End-to-end latency, sim engine taking no time\n\n"
        f"Command: `{command}` (on the project's 2-core machine, local single-node Kafka)\n\n"
        "| measured from send | p50 ms | p90 ms | p99 ms | mean ms |\n|---|---|---|---|---|\n"
        f"| first token chunk | {f['p50']} | {f['p90']} | {f['p99']} | {f['mean']} |\n"
        f"| final chunk | {t['p50']} | {t['p90']} | {t['p99']} | {t['mean']} |\n"
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
