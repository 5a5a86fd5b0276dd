"""The peer benchmark: llmbus against TensorZero, LiteLLM and the upstream itself, side by side in one run.

The same zero-cost streaming upstream (bench.peer_upstream) is called (a) directly, (b) through
TensorZero's Rust gateway from its PyPI wheel, (c) through LiteLLM's proxy (2 workers), each peer in
a virtualenv of its own under the llmbus cache (bench.peer_venvs), and (d) through llmbus: gateway →
router → scheduler → openai-http worker (bench.peer_llmbus), with `--baseline-tree PATH` a second
llmbus checkout run the same way beside it. One path at a time; at each concurrency the project's
driver (bench.peer_load: N requests, CPU per request of every process) and then inference-perf
(bench.peer_inference_perf, an external load generator for OpenAI-compatible servers, in its own
Python >= 3.12 venv) put N streamed chat requests through. `--profile` adds CPU-clock profiles of
the llmbus services at c = 1 and 64 (bench.peer_profile). Reports: bench/reports/peer.{json,md,png}
(and peer_profile.{json,md}).

    python -m bench.peer_bench [--quick] [--requests 1000] [--concurrency 1,16,64]
        [--targets upstream,tensorzero,litellm,llmbus] [--baseline-tree PATH] [--infra private|shared]
        [--no-inference-perf] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil

from bench import peer_inference_perf, peer_llmbus, peer_profile, peer_targets, peer_venvs
from bench.peer_load import closed_loop
from bench.peer_report import compare, summarise_point, verdicts, write_reports
from bench.peer_targets import Target
from bench.pipeline_load import CpuWindow
from llmbus_tools.harness.service_procs import REPO
from llmbus_tools.harness.tiny_llama import build_tiny_llama

REPORTS = REPO / "bench" / "reports"
PROJECT_PACKAGES = (
    "aiokafka",
    "redis",
    "hiredis",
    "pydantic",
    "uvloop",
    "uvicorn",
    "httptools",
    "fastapi",
    "psutil",
    "yappi",
)


def versions() -> dict[str, str]:
    out = {"python (llmbus, drivers)": platform.python_version(), "os": platform.platform()}
    for package in PROJECT_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[f"{package} (python package)"] = importlib.metadata.version(package)
    return out


def run_facts(command: str, started: str, loadavg_start: list[float]) -> dict:
    """What every bench report of this family opens with: the command, when, where, and the load around it."""
    return {
        "command": command,
        "started": started,
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_start": loadavg_start,
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
    }


def machine() -> str:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    memory_gib = psutil.virtual_memory().total / 2**30
    return f"{psutil.cpu_count()} cores ({model}), {memory_gib:.0f} GiB"


async def measure(target: Target, upstream_pid: int, args: argparse.Namespace, work: Path) -> list[dict]:
    """The target's idle CPU, then every concurrency: the project driver (with CPU), then inference-perf."""
    idle = CpuWindow(target.roles, with_children=target.roles)
    idle.start()
    await asyncio.sleep(args.idle_s)
    window = idle.stop()
    idle_s = float(window["elapsed_s"])  # type: ignore[arg-type]
    cores = {role: round(s / idle_s, 4) for role, s in window["cpu_s"].items()}  # type: ignore[attr-defined]
    rows: list[dict] = [{"target": target.name, "driver": "idle", "concurrency": 0, "idle_cores": cores}]
    for c in args.concurrency:
        tag = f"{target.name}-c{c}".replace(" ", "_")
        common = {"concurrency": c, "tokens": args.tokens}
        await closed_loop(
            target.base_url, target.model, target.headers, requests=max(args.warmup, 5 * c), tag=f"w-{tag}", **common
        )
        counts = await _bus_counts(target)
        # Children count for the targets' roles (LiteLLM's workers), not for the driver: the bench
        # process is the parent of every process it started.
        cpu = CpuWindow(target.roles | {"upstream": upstream_pid, "driver": os.getpid()}, with_children=target.roles)
        cpu.start()
        samples, elapsed_s = await closed_loop(
            target.base_url, target.model, target.headers, requests=args.requests, tag=tag, **common
        )
        row = summarise_point(target.name, c, samples, elapsed_s, cpu.stop())
        if counts is not None:
            after = await _bus_counts(target)
            assert after is not None
            row["kafka_records_per_request"] = peer_profile.per_request(counts[0], after[0], len(samples))
            row["redis_commands_per_request"] = peer_profile.per_request(counts[1], after[1], len(samples))
        rows.append(row)
        print(f"[peer] {target.name} c={c}: {_headline(row)}", file=sys.stderr, flush=True)
        if args.inference_perf is not None:
            ip = peer_inference_perf.run(args.inference_perf, target, c, args.requests, args.tokenizer, work)
            rows.append({"target": target.name, "driver": "inference-perf", "concurrency": c} | ip)
            print(f"[peer] {target.name} c={c} inference-perf: {_headline(rows[-1])}", file=sys.stderr, flush=True)
    return rows


async def _bus_counts(target: Target) -> tuple[dict[str, int], dict[str, int]] | None:
    settings = target.bus_settings
    if settings is None:
        return None
    return await peer_profile.end_offsets(settings), peer_profile.redis_commands(settings.redis_url)


def _headline(row: dict) -> str:
    if "error" in row:
        return f"FAILED: {row['error']}"
    first = row["first_token_ms"]
    return (
        f"{row['requests_per_s']} req/s, first token p50 {first['p50']} p99 {first['p99']} ms, "
        f"final p99 {row['final_ms']['p99']} ms, errors {row['errors']}"
        + (
            f", control-plane CPU {row['control_plane_cpu_ms_per_request']} ms/req"
            if "cpu_ms_per_request" in row
            else ""
        )
    )


@contextlib.asynccontextmanager
async def infra_for(args: argparse.Namespace, work: Path) -> AsyncIterator[peer_llmbus.Infra | None]:
    if not any(t.startswith("llmbus") for t in args.targets) and not args.profile:
        yield None
    elif args.infra == "private":
        async with peer_llmbus.private_infra(work) as infra:
            yield infra
    else:
        async with peer_llmbus.shared_infra() as infra:
            yield infra


async def profile_llmbus(upstream: Target, infra: peer_llmbus.Infra, args: argparse.Namespace, work: Path) -> dict:
    """The llmbus services with CPU profiles on, one window per profiled concurrency."""
    profile_dir = work / "profiles"
    windows = []
    async with peer_llmbus.llmbus("llmbus (profiled)", REPO, upstream.base_url, infra, work, profile_dir) as target:
        services = {r: pid for r, pid in target.roles.items() if r not in infra.roles}
        for k, c in enumerate(args.profile_concurrency, start=1):
            n = args.profile_requests
            common = {"concurrency": c, "tokens": args.tokens}
            await closed_loop(
                target.base_url, target.model, target.headers, requests=max(args.warmup, 5 * c), tag=f"pw{c}", **common
            )
            before = await _bus_counts(target)
            assert before is not None
            cpu = CpuWindow(target.roles, with_children=target.roles)
            peer_profile.start_windows(services)
            cpu.start()
            samples, elapsed_s = await closed_loop(
                target.base_url, target.model, target.headers, requests=n, tag=f"p{c}", **common
            )
            window = cpu.stop()
            peer_profile.end_windows(services, k, profile_dir, work / "profile-windows" / f"c{c}")
            after = await _bus_counts(target)
            assert after is not None
            point = summarise_point(target.name, c, samples, elapsed_s, window)
            profiles = {
                role: peer_profile.summarise_profile(work / "profile-windows" / f"c{c}" / f"{role}.pstat", n)
                for role in services
            }
            windows.append(
                {
                    "concurrency": c,
                    "requests": n,
                    "requests_per_s": point["requests_per_s"],
                    "errors": point["errors"],
                    "cpu_ms_per_request": point["cpu_ms_per_request"],
                    "loadavg_1min": point["loadavg_1min"],
                    "kafka_records_per_request": peer_profile.per_request(before[0], after[0], n),
                    "redis_commands_per_request": peer_profile.per_request(before[1], after[1], n),
                    "profiles": profiles,
                }
            )
            print(f"[peer] profiled c={c}: {_headline(point)}", file=sys.stderr, flush=True)
        redis_calls = await redis_by_role(target, services, args.tokens)
    return {"windows": windows, "redis_calls_per_request_by_service": redis_calls}


async def redis_by_role(target: Target, services: dict[str, int], tokens: int, requests: int = 20) -> dict[str, float]:
    """Which service sends which Redis command, per request: MONITOR on the run's Redis while
    `requests` go through one at a time (timers firing meanwhile are in the counts too)."""
    assert target.bus_settings is not None
    with tempfile.TemporaryFile("w+") as out:
        monitor = await asyncio.create_subprocess_exec(
            "redis-cli", "-u", target.bus_settings.redis_url, "MONITOR", stdout=out
        )
        try:
            await asyncio.sleep(1.0)
            ports = peer_profile.client_ports(services)
            await closed_loop(
                target.base_url, target.model, target.headers, concurrency=1, requests=requests, tokens=tokens, tag="m"
            )
            await asyncio.sleep(0.5)
        finally:
            monitor.terminate()
            await asyncio.wait_for(monitor.wait(), 30)
        out.seek(0)
        output = out.read()
    calls = peer_profile.redis_calls_by_role(output, ports, target.bus_settings.topic_prefix)
    return {call: round(n / requests, 2) for call, n in sorted(calls.items())}


async def amain(args: argparse.Namespace, work: Path) -> tuple[dict, dict | None]:
    rows: list[dict] = []
    notes: list[str] = []
    failures: list[str] = []
    all_versions = versions()
    loadavg_start = [round(x, 2) for x in os.getloadavg()]
    started = datetime.datetime.now().isoformat(timespec="seconds")
    profile: dict | None = None
    async with infra_for(args, work) as infra, peer_targets.upstream(work, args.tokens) as upstream:
        upstream_pid = upstream.roles["upstream"]
        for name in args.targets:
            if name == "upstream":
                context = contextlib.nullcontext(upstream)
            elif name == "tensorzero":
                context = peer_targets.tensorzero(upstream.base_url, work)
            elif name == "litellm":
                context = peer_targets.litellm(upstream.base_url, work, args.litellm_workers)
            else:
                assert infra is not None
                context = peer_llmbus.llmbus("llmbus", REPO, upstream.base_url, infra, work)
            contexts = [(name, context)]
            if name == "llmbus" and args.baseline_tree is not None:
                assert infra is not None
                label = f"llmbus baseline ({args.baseline_tree.name})"
                contexts.append((label, peer_llmbus.llmbus(label, args.baseline_tree, upstream.base_url, infra, work)))
            for label, context in contexts:
                print(f"[peer] starting {label}", file=sys.stderr, flush=True)
                try:
                    async with context as target:  # type: ignore[attr-defined]
                        rows += await measure(target, upstream_pid, args, work)
                        notes += target.notes
                        all_versions |= target.versions
                # One path that cannot start does not void the others' figures.
                except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError, httpx.HTTPError) as exc:
                    failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:500]}")
                    print(f"[peer] {label} FAILED: {exc}", file=sys.stderr, flush=True)
        if args.profile:
            assert infra is not None
            profile = await profile_llmbus(upstream, infra, args, work)
    if args.inference_perf is not None:
        all_versions["inference-perf"] = args.inference_perf.version_of("inference-perf")
        all_versions["inference-perf python"] = args.inference_perf.python_version()
    notes.append("upstream: bench/peer_upstream.py, one process (uvloop + httptools), whole answer in one write")
    baseline = f"llmbus baseline ({args.baseline_tree.name})" if args.baseline_tree is not None else None
    comparisons = compare(rows)
    report = {
        **run_facts(args.command, started, loadavg_start),
        "requests": args.requests,
        "tokens": args.tokens,
        "concurrency": args.concurrency,
        "infra": args.infra,
        "versions": all_versions,
        "notes": notes + args.notes,
        "warnings": warnings(loadavg_start, rows) + [f"failed: {f}" for f in failures],
        "rows": rows,
        "comparisons": comparisons,
        "verdicts": verdicts(rows, comparisons, "llmbus", baseline) if "llmbus" in args.targets else [],
    }
    if profile is not None:
        profile |= {"command": args.command, "started": started, "versions": all_versions, "machine": report["machine"]}
    return report, profile


def warnings(loadavg_start: list[float], rows: list[dict]) -> list[str]:
    out = []
    cores = psutil.cpu_count() or 1
    if loadavg_start[0] > cores:
        out.append(
            f"the machine was busy (load average {loadavg_start[0]} on {cores} cores at the start): other "
            "processes took CPU from every path, unevenly; redo on a quiet machine before quoting figures"
        )
    others = [r["others_busy_cores"] for r in rows if "others_busy_cores" in r]
    if others and max(others) > 0.25:
        out.append(f"processes outside the benchmark used up to {max(others)} cores during a window (column 'others')")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 requests per point, a short warm-up (CI-size)")
    parser.add_argument("--requests", type=int, default=1000, help="requests per point")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument(
        "--warmup", type=int, default=100, help="warm-up requests before each point (at least 5 per client)"
    )
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle window per target (its fixed CPU)")
    parser.add_argument(
        "--targets", default="upstream,tensorzero,litellm,llmbus", help="'' with --profile: the profiles alone"
    )
    parser.add_argument("--baseline-tree", type=Path, help="another llmbus checkout, measured beside this one")
    parser.add_argument("--infra", choices=("private", "shared"), default="private", help="llmbus's broker and Redis")
    parser.add_argument("--litellm-workers", type=int, default=2)
    parser.add_argument("--no-inference-perf", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also profile the llmbus services (peer_profile.*)")
    parser.add_argument("--profile-concurrency", default="1,64")
    parser.add_argument("--profile-requests", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=REPORTS / "peer")
    parser.add_argument("--profile-out", type=Path, default=REPORTS / "peer_profile")
    args = parser.parse_args(argv)
    args.command = "python -m bench.peer_bench " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.quick:
        args.requests, args.warmup, args.profile_requests, args.idle_s = 200, 30, 300, 4.0
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.profile_concurrency = [int(c) for c in args.profile_concurrency.split(",")]
    args.targets = [t for t in args.targets.split(",") if t]
    args.notes = []
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.inference_perf = None
    if not args.no_inference_perf:
        python = peer_venvs.python_at_least((3, 12))
        if python is None:
            args.notes.append("inference-perf skipped: no Python >= 3.12 on this machine (it needs one)")
        else:
            args.inference_perf = peer_venvs.inference_perf(python).ensure()
            args.tokenizer = build_tiny_llama()
    # SIGTERM (a `timeout`, a CI cancel) unwinds like Ctrl-C: every started process is stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="llmbus-peer-bench-") as tmp:
        report, profile = asyncio.run(amain(args, Path(tmp)))
    if args.targets:
        write_reports(report, args.out)
        print(f"[peer] wrote {args.out}.md", file=sys.stderr)
    if profile is not None:
        out = args.profile_out
        out.with_suffix(".json").write_text(json.dumps(profile, indent=2) + "\n")
        peer_profile.update_page(out.with_suffix(".md"), peer_profile.markdown_tables(profile))
        print(f"[peer] wrote {out}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
