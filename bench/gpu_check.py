"""The GPU check: on a machine with an NVIDIA GPU, what the CPU build cannot show.

    make gpu-check                              # python -m bench.gpu_check
    python -m bench.gpu_check --skip-bench      # without the worker-vs-AsyncLLM comparison
    python -m bench.gpu_check --skip-tests      # without the vLLM engine tests

Steps, each one's outcome in bench/reports/gpu_check.md (and .json):
1. node profile from the real NVML (services/engine_worker/adapters/node/profile.py): GPUs, VRAM, driver,
   CUDA, compute capability, ECC counters, health, and the format an 8B model would run as.
2. the vLLM engine tests (tests/integration/test_vllm_{engine,chat,scheduling}.py) on the GPU,
   with the tiny random-weight models; each session engine takes a small share of the VRAM.
3. CUDA graphs: the tiny model started eager, then as the worker starts it on a GPU (graphs
   captured), each warmed up with the worker's plan (5 x 1,024 dummy tokens); the cold-start
   phases of each and the decode throughput of 16 concurrent requests.
4. worker vs AsyncLLM: `bench.worker_vllm_bench --model tiny --report-suffix _gpu` (the worker
   process over Kafka against AsyncLLM in-process); needs Kafka and Redis at their usual addresses
   (deploy/kafka/kafka.sh start, deploy/redis/redis.sh start) and is skipped, with that reason,
   when they do not answer.
Without a GPU it says so and exits with status 2, writing nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from llmbus.contract.messages import NodeProfile
from llmbus.process.launch import checkout_pythonpath

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "bench" / "reports"
COMMAND = "make gpu-check"
ENGINE_TESTS = (
    "tests/integration/test_vllm_engine.py",
    "tests/integration/test_vllm_chat.py",
    "tests/integration/test_vllm_scheduling.py",
)
TEST_GPU_SHARE = "0.2"  # per session engine (two at most at once)
NO_GPU_EXIT = 2
DECODE_REQUESTS, DECODE_TOKENS = 16, 128


@dataclass
class Step:
    name: str
    ok: bool | None  # None: skipped
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--skip-tests", action="store_true", help="do not run the vLLM engine tests")
    parser.add_argument("--skip-graphs", action="store_true", help="do not compare eager with CUDA graphs")
    parser.add_argument("--skip-bench", action="store_true", help="do not run the worker-vs-AsyncLLM bench")
    parser.add_argument("--repeats", type=int, default=1, help="repeats of the worker bench")
    parser.add_argument("--out", type=Path, default=REPORTS / "gpu_check.md", help="the Markdown report")
    return parser.parse_args(argv)


def find_gpus(nvml: ModuleType | None = None) -> NodeProfile:
    from llmbus_services.engine_worker.adapters.node.profile import profile_node

    return profile_node(nvml=nvml)


def node_step(profile: NodeProfile) -> Step:
    from llmbus_services.engine_worker.core.formats import NoFormatFits, choose_format
    from llmbus_services.engine_worker.core.node_plan import gpu_healthy

    gpu = profile.gpus[0]
    detail = f"{len(profile.gpus)} x {gpu.name}, {gpu.memory_total_bytes / 2**30:.1f} GiB, CC {gpu.compute_capability}"
    data = profile.model_dump(mode="json")
    data["gpu_healthy"] = gpu_healthy(profile)
    from llmbus.contract.messages.fleet import ModelFormat

    formats = [
        ModelFormat(name="bf16", weight_bytes=16_060_000_000, min_compute_capability="8.0"),
        ModelFormat(name="fp8", weight_bytes=8_030_000_000, min_compute_capability="8.9"),
        ModelFormat(name="awq", weight_bytes=5_730_000_000, min_compute_capability="7.5"),
    ]
    try:
        choice = choose_format(formats, gpu.compute_capability, gpu.memory_free_bytes)
        data["llama_8b_format"] = f"{choice.format.name}: {choice.reason}"
    except NoFormatFits as exc:
        data["llama_8b_format"] = f"none: {exc}"
    return Step("node profile (NVML)", data["gpu_healthy"], detail, data)


def tests_step() -> Step:
    env = os.environ | {"LLMBUS_TEST_GPU_MEMORY_UTILIZATION": TEST_GPU_SHARE, "PYTHONPATH": _pythonpath()}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENGINE_TESTS]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-500:]
    tail = "\n".join(lines[-40:])
    took_s = round(time.monotonic() - started, 1)
    return Step("vLLM engine tests on the GPU", proc.returncode == 0, f"{summary} ({took_s} s)", {"tail": tail})


async def _engine_run(enforce_eager: bool | None) -> dict[str, Any]:
    from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
    from llmbus_services.engine_worker.core.engine import EngineRequest
    from llmbus_tools.harness.vllm_config import tiny_vllm_config

    config = tiny_vllm_config(
        enforce_eager=enforce_eager,
        max_model_len=2048,
        max_num_seqs=DECODE_REQUESTS,
        warmup_iterations=5,
        warmup_prompt_tokens=1024,
        gpu_memory_utilization=0.3,
    )
    engine = VllmEngine(config)
    await engine.start()
    await engine.warmup()
    try:

        async def one(i: int) -> int:
            request = EngineRequest(f"decode-{i}", f"the kafka broker {i}", DECODE_TOKENS, temperature=0.0)
            last = 0
            async for out in engine.generate(request):
                last = out.completion_tokens
            return last

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(DECODE_REQUESTS))))
        wall_s = time.perf_counter() - started
    finally:
        await engine.stop()
    return {
        "enforce_eager": engine.enforce_eager(),
        "cold_start_phases_s": engine.cold_start_phases_s,
        "decode_tokens": tokens,
        "decode_tokens_per_s": round(tokens / wall_s, 1),
    }


def graphs_step() -> Step:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    runs = {"eager": asyncio.run(_engine_run(True)), "cuda_graphs": asyncio.run(_engine_run(None))}
    graphs, eager = runs["cuda_graphs"], runs["eager"]
    ok = graphs["enforce_eager"] is False and graphs["decode_tokens"] == eager["decode_tokens"]
    speedup = graphs["decode_tokens_per_s"] / eager["decode_tokens_per_s"] if eager["decode_tokens_per_s"] else 0
    detail = (
        f"decode {graphs['decode_tokens_per_s']} tok/s with CUDA graphs, {eager['decode_tokens_per_s']} eager "
        f"(x{speedup:.2f}); engine core start {graphs['cold_start_phases_s'].get('engine_core')} s with graph "
        f"capture, {eager['cold_start_phases_s'].get('engine_core')} s eager"
    )
    return Step("CUDA-graph warm-up", ok, detail, runs)


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _pythonpath() -> str:
    return os.pathsep.join([checkout_pythonpath(REPO), os.environ.get("PYTHONPATH", "")])


def bench_step(repeats: int) -> Step:
    missing = [name for name, port in (("Kafka", 9092), ("Redis", 6379)) if not _answers(port)]
    if missing:
        return Step(
            "worker vs AsyncLLM",
            None,
            f"skipped: {' and '.join(missing)} not answering on 127.0.0.1 (deploy/kafka/kafka.sh start, "
            "deploy/redis/redis.sh start)",
        )
    cmd = [sys.executable, "-m", "bench.worker_vllm_bench", "--model", "tiny", "--repeats", str(repeats)]
    cmd += ["--report-suffix", "_gpu"]
    env = os.environ | {"PYTHONPATH": _pythonpath()}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    report = REPORTS / "worker_vllm_bench_gpu.json"
    if proc.returncode != 0 or not report.exists():
        return Step("worker vs AsyncLLM", False, f"bench failed ({proc.returncode}): {proc.stderr[-800:]}")
    summary = json.loads(report.read_text())["summary"]
    rows = [
        f"{a['side']} {a['shape']}: {a['output_tokens_per_s_mean']:.0f} tok/s (ratio {a['ratio_to_direct']})"
        for a in summary
    ]
    return Step("worker vs AsyncLLM", True, "; ".join(rows), {"summary": summary})


def render(profile: NodeProfile, steps: list[Step], took_s: float) -> str:
    mark = {True: "pass", False: "FAIL", None: "skipped"}
    gpu = profile.gpus[0]
    lines = [
        "# GPU check",
        "",
        f"Command: `{COMMAND}` ({took_s:.0f} s). Machine: {platform.machine()}, {os.cpu_count()} cores, "
        f"{gpu.name} x {len(profile.gpus)}, driver {profile.driver_version}, CUDA {profile.cuda_driver_version}.",
        "",
        "| step | outcome | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {s.name} | {mark[s.ok]} | {s.detail} |" for s in steps]
    for s in steps:
        if s.data:
            lines += ["", f"## {s.name}", "", "```json", json.dumps(s.data, indent=2, default=str)[:6000], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, nvml: ModuleType | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    profile = find_gpus(nvml)
    if not profile.gpus:
        print(
            "gpu-check: no NVIDIA GPU on this machine (NVML found none, or no driver): nothing checked, "
            "no report written. Run it on a GPU host with the GPU build (`pip install vllm`); see "
            "services/engine_worker/README.md.",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    steps = [node_step(profile)]
    if not args.skip_tests:
        steps.append(tests_step())
    if not args.skip_graphs:
        steps.append(graphs_step())
    if not args.skip_bench:
        steps.append(bench_step(args.repeats))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(profile, steps, time.monotonic() - started))
    args.out.with_suffix(".json").write_text(json.dumps([s.__dict__ for s in steps], indent=2, default=str))
    for s in steps:
        print(f"{s.name}: {s.ok} - {s.detail}")
    print(f"wrote {args.out}")
    return 0 if all(s.ok is not False for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
