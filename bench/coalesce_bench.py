"""Request coalescing measured on the real stack: bursts of identical requests, coalescing on vs off.

    python -m bench.coalesce_bench [--prompts 6] [--burst 5] [--max-tokens 64]

For each mode a fresh namespace and stack (router + scheduler + one sim worker at real speed) is
started; `--prompts` distinct deterministic prompts are each sent as a burst of `--burst`
identical requests at once (bursts 1 s apart). Measured per mode: generations (results not
`cached`), completion tokens the worker generated, CPU-seconds of the worker and the router
(psutil, over the load window), and client-side latency to the final chunk. Both modes run
side by side in one run on the same host. Writes bench/reports/coalesce.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import yaml

from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import ChatMessage, InferenceRequest, InferenceResult, TokenChunk
from llmbus_services.router.core.config import load_policy
from llmbus_tools.harness.service_procs import ServiceProc, drop_namespace, fresh_settings, wait_workers_ready

REPORTS = Path(__file__).resolve().parent / "reports"


def cpu_s(proc: ServiceProc) -> float:
    assert proc.proc is not None
    times = psutil.Process(proc.proc.pid).cpu_times()
    return times.user + times.system


async def run_mode(coalesce: bool, prompts: int, burst: int, max_tokens: int, workdir: Path) -> dict:
    settings = fresh_settings()
    await ensure_catalog(settings)
    raw = load_policy().model_dump(mode="json")
    raw["coalesce"]["enabled"] = coalesce
    policy_path = workdir / f"policy-{coalesce}.yaml"
    policy_path.write_text(yaml.safe_dump(raw))
    procs = [
        ServiceProc(
            "llmbus_services.router", settings, env={"LLMBUS_ROUTER_POLICY_PATH": str(policy_path)}, log_dir=workdir
        ),
        ServiceProc("llmbus_services.scheduler", settings, log_dir=workdir),
        ServiceProc(
            "llmbus_services.engine_worker",
            settings,
            name="w1",
            env={"LLMBUS_WORKER_WORKER_ID": "w1", "LLMBUS_WORKER_MODEL": "sim-llama-8b"},
            log_dir=workdir,
        ),
    ]
    for proc in procs:
        proc.start()
    topics = t.Topics(settings.topic_prefix)
    bus = await Bus.start(settings, t.CLIENT)
    tokens_tail = await TopicTail(settings, topics.name(t.TOKENS)).start()
    results_tail = await TopicTail(settings, topics.name(t.RESULTS)).start()
    try:
        await wait_workers_ready(settings, {"w1"}, timeout_s=120)
        # Warm-up: the router is up once a request is answered end to end.
        warm = InferenceRequest(model="sim-llama-8b", prompt="warm-up", max_tokens=4)
        await bus.publisher.publish(topics.name(t.REQUESTS), warm, key=warm.request_id)
        async for record in tokens_tail.records(120):
            if decode(record, TokenChunk).final:  # type: ignore[arg-type]
                break
        router, worker = procs[0], procs[2]
        cpu_before = {"router": cpu_s(router), "worker": cpu_s(worker)}
        run = uuid.uuid4().hex[:6]
        sent_at: dict[str, float] = {}
        latency_ms: dict[str, float] = {}
        expected = prompts * burst

        async def read_finals() -> None:  # concurrently with sending: latency is measured as chunks arrive
            async for record in tokens_tail.records(180):
                chunk = decode(record, TokenChunk)  # type: ignore[arg-type]
                if chunk.final and chunk.request_id in sent_at and chunk.request_id not in latency_ms:
                    latency_ms[chunk.request_id] = (time.perf_counter() - sent_at[chunk.request_id]) * 1000
                    if len(latency_ms) == expected:
                        return

        reader = asyncio.create_task(read_finals())
        for p in range(prompts):
            asks = [
                InferenceRequest(
                    request_id=f"{run}-{p}-{i}",
                    model="sim-llama-8b",
                    temperature=0.0,
                    max_tokens=max_tokens,
                    messages=[ChatMessage(role="user", content=f"Question {p} of run {run}: explain consumer lag.")],
                )
                for i in range(burst)
            ]
            now = time.perf_counter()
            sent_at |= {a.request_id: now for a in asks}
            await asyncio.gather(*[bus.publisher.publish(topics.name(t.REQUESTS), a, key=a.request_id) for a in asks])
            await asyncio.sleep(1.0)
        await reader
        results: dict[str, InferenceResult] = {}
        async for record in results_tail.records(10):
            result = decode(record, InferenceResult)  # type: ignore[arg-type]
            if result.request_id in sent_at:
                results[result.request_id] = result
            if len(results) == len(sent_at):
                break
        cpu = {
            name: round(cpu_s(proc) - cpu_before[name], 2) for name, proc in (("router", router), ("worker", worker))
        }
    finally:
        await tokens_tail.stop()
        await results_tail.stop()
        await bus.stop()
        for proc in procs:
            proc.kill()
        await drop_namespace(settings)
    generated = [r for r in results.values() if not r.cached]
    latencies = sorted(latency_ms.values())
    n = len(sent_at)
    return {
        "coalesce": coalesce,
        "requests": n,
        "answered": len(latency_ms),
        "results": len(results),
        "generations": len(generated),
        "coalesced_or_cached": len(results) - len(generated),
        "completion_tokens_generated": sum(r.usage.completion_tokens for r in generated),
        "cpu_s": cpu,
        "worker_cpu_ms_per_request": round(1000 * cpu["worker"] / n, 1),
        "latency_to_final_ms": {
            "p50": round(latencies[len(latencies) // 2], 1) if latencies else None,
            "max": round(latencies[-1], 1) if latencies else None,
            "mean": round(statistics.fmean(latencies), 1) if latencies else None,
        },
    }


def write_md(report: dict, path: Path) -> None:
    lines = [
        "# Request coalescing on the real stack",
        "",
        f"Command: `{report['command']}`  ·  load average at start {report['load_avg_1m']:.1f} "
        f"(shared 2-core host)  ·  {report['prompts']} prompts x bursts of {report['burst']} identical requests,"
        f" max_tokens {report['max_tokens']}, sim worker at real speed",
        "",
        "| coalescing | requests | answered | generations | tokens generated | worker CPU s | router CPU s "
        "| worker CPU ms / request | latency to final p50 ms | max ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m in report["modes"]:
        lat = m["latency_to_final_ms"]
        lines.append(
            f"| {'on' if m['coalesce'] else 'off'} | {m['requests']} | {m['answered']} | {m['generations']} "
            f"| {m['completion_tokens_generated']} | {m['cpu_s']['worker']} | {m['cpu_s']['router']} "
            f"| {m['worker_cpu_ms_per_request']} | {lat['p50']} | {lat['max']} |"
        )
    lines += [
        "",
        "- generations = results not marked `cached`; with coalescing each burst should cost one",
        "- the sim worker's CPU is the simulator's, not a GPU's: the saving that matters is generations and tokens",
        "",
    ]
    path.write_text("\n".join(lines))


async def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--burst", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    load = os.getloadavg()[0]
    modes = []
    with tempfile.TemporaryDirectory() as tmp:
        for coalesce in (True, False):
            print(f"mode coalesce={coalesce} ...", flush=True)
            modes.append(await run_mode(coalesce, args.prompts, args.burst, args.max_tokens, Path(tmp)))
            print(json.dumps(modes[-1]), flush=True)
    report = {
        "command": "python -m bench.coalesce_bench " + " ".join(argv),
        "prompts": args.prompts,
        "burst": args.burst,
        "max_tokens": args.max_tokens,
        "load_avg_1m": load,
        "cpus": os.cpu_count(),
        "modes": modes,
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "coalesce.json").write_text(json.dumps(report, indent=2) + "\n")
    write_md(report, REPORTS / "coalesce.md")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
