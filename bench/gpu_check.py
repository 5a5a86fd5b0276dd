"""The GPU check: on a machine with an NVIDIA GPU, what the CPU build cannot show, in one bounded run.

    make gpu-check                            # scripts/gpu_check.sh: a GPU? → setup with vLLM's GPU build → this
    python -m bench.gpu_check --plan          # the steps, their time limits and commands; runs nothing, any machine
    python -m bench.gpu_check --skip-bench    # without the worker-vs-AsyncLLM comparison (also --skip-tests, ...)

Before the steps: without a GPU (NVML finds none, or no driver) it says so and exits with status 2, writing
nothing; an installed vLLM other than the tested release is refused as the worker refuses it
(adapters/engines/vllm_version.py), with status 3. Then each step runs within its own time limit, all of
them within BUDGET_S, so the whole check ends (its report written) well inside 10 minutes:
1. Kafka and Redis: answering at 127.0.0.1:9092 and :6379, else started with deploy/kafka/kafka.sh start and
   deploy/redis/redis.sh start (left running, as `make infra` leaves them; `make down` stops them).
2. node profile from the real NVML (libs/common/llmbus/node/probe.py): GPUs, VRAM, driver,
   CUDA, compute capability, ECC counters, health, and the format Llama-3.1-8B would run as.
3. the vLLM engine tests (ENGINE_TESTS) on the GPU, with the tiny random-weight models; each session engine
   takes TEST_GPU_SHARE of the VRAM.
4. CUDA graphs (bench/gpu_graphs.py): the tiny model eager, then as the worker starts it on a GPU, each with
   its cold-start phases (weights, KV pool, kernels, warm-up) and the decode throughput of 16 requests.
5. worker vs AsyncLLM: `bench.worker_vllm_bench --model tiny --repeats 1 --report-suffix _gpu`, the worker
   process over Kafka against AsyncLLM in-process.
Each step's outcome goes to bench/reports/gpu_check.md (and .json), with what it took.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from llmbus.contract.messages import NodeProfile
from llmbus.process.launch import checkout_pythonpath
from llmbus_services.engine_worker.adapters.engines.vllm_version import (
    InstalledVllm,
    UntestedVllmVersion,
    check_vllm_version,
    installed_vllm,
)

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "bench" / "reports"
COMMAND = "make gpu-check"
ENGINE_TESTS = (
    "tests/integration/test_vllm_engine.py",
    "tests/integration/test_vllm_chat.py",
    "tests/integration/test_vllm_bos.py",
    "tests/integration/test_vllm_scheduling.py",
    "tests/unit/test_vllm_settings.py",
)
TEST_GPU_SHARE = "0.2"  # per session engine (two at most at once)
NO_GPU_EXIT, UNTESTED_VLLM_EXIT = 2, 3
BUDGET_S = 540  # every step together; the rest of 10 minutes is the report and the interpreter's start
SERVICES = (("Kafka", 9092, "deploy/kafka/kafka.sh"), ("Redis", 6379, "deploy/redis/redis.sh"))


@dataclass
class Step:
    name: str
    ok: bool | None  # None: skipped
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    took_s: float = 0.0


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None: killed at its time limit
    stdout: str
    stderr: str


def run_command(cmd: list[str], env: dict[str, str], timeout_s: float) -> Ran:
    """A step's command from the repository root, killed (with its children) at `timeout_s`."""
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Ran(None, out, err)
    return Ran(proc.returncode, proc.stdout, proc.stderr)


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class Check:
    """What the steps call to run commands and to see the services: real by default, fakes in the tests."""

    run: Callable[[list[str], dict[str, str], float], Ran] = run_command
    answers: Callable[[int], bool] = answers
    installed_vllm: Callable[[], InstalledVllm | None] = installed_vllm
    reports: Path = REPORTS
    started_at: float = field(default_factory=time.monotonic)

    def left_s(self) -> float:
        return BUDGET_S - (time.monotonic() - self.started_at)

    def limit_s(self, step_limit_s: float) -> float:
        return max(1.0, min(step_limit_s, self.left_s()))


def _env() -> dict[str, str]:
    return os.environ | {"PYTHONPATH": os.pathsep.join([checkout_pythonpath(REPO), os.environ.get("PYTHONPATH", "")])}


def _tail(ran: Ran, chars: int = 800) -> str:
    return (ran.stderr.strip() or ran.stdout.strip())[-chars:]


# ---- the steps: name, time limit, command (None: runs in this process) -------------------------


def test_command() -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ENGINE_TESTS]


def graphs_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "bench.gpu_graphs", "--out", str(out)]


def bench_command() -> list[str]:
    args = ["--model", "tiny", "--repeats", "1", "--report-suffix", "_gpu"]
    return [sys.executable, "-m", "bench.worker_vllm_bench", *args]


LIMITS_S = {"infra": 60, "node": 15, "tests": 180, "graphs": 120, "bench": 165}


def plan(args: argparse.Namespace) -> list[tuple[str, int, str]]:
    """The steps this run takes: (step, time limit in seconds, what it runs)."""
    infra = " / ".join(f"{script} start unless :{port} answers" for _, port, script in SERVICES)
    steps = [
        ("infra", LIMITS_S["infra"], infra),
        ("node", LIMITS_S["node"], "NVML node profile and the format choice (in this process)"),
    ]
    if not args.skip_tests:
        steps.append(("tests", LIMITS_S["tests"], " ".join(test_command()[1:])))
    if not args.skip_graphs:
        steps.append(("graphs", LIMITS_S["graphs"], " ".join(graphs_command(Path("<tmp>.json"))[1:])))
    if not args.skip_bench:
        steps.append(("bench", LIMITS_S["bench"], " ".join(bench_command()[1:])))
    return steps


def infra_step(check: Check) -> Step:
    started, failed = [], []
    for name, port, script in SERVICES:
        if check.answers(port):
            continue
        ran = check.run([script, "start"], dict(os.environ), check.limit_s(LIMITS_S["infra"]))
        if ran.returncode == 0 and check.answers(port):
            started.append(name)
        else:
            failed.append(f"{name} did not start ({script} start: {ran.returncode}): {_tail(ran, 400)}")
    if failed:
        return Step("Kafka and Redis", False, "; ".join(failed))
    detail = f"started {' and '.join(started)}" if started else "both answering already"
    return Step("Kafka and Redis", True, detail, {"started": started})


def node_step(profile: NodeProfile) -> Step:
    from llmbus_services.engine_worker.adapters.node.profile import example_format_choice
    from llmbus_services.engine_worker.core.node_plan import gpu_healthy

    gpu = profile.gpus[0]
    detail = f"{len(profile.gpus)} x {gpu.name}, {gpu.memory_total_bytes / 2**30:.1f} GiB, CC {gpu.compute_capability}"
    data = profile.model_dump(mode="json")
    data["gpu_healthy"] = gpu_healthy(profile)
    chosen, why = example_format_choice(profile)
    data["llama_8b_format"] = f"{chosen}: {why}" if chosen else f"none: {why}"
    return Step("node profile (NVML)", data["gpu_healthy"], detail, data)


def tests_step(check: Check) -> Step:
    env = _env() | {"LLMBUS_TEST_GPU_MEMORY_UTILIZATION": TEST_GPU_SHARE}
    limit = check.limit_s(LIMITS_S["tests"])
    ran = check.run(test_command(), env, limit)
    lines = [line for line in ran.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else _tail(ran, 500)
    if ran.returncode is None:
        summary = f"killed at its limit of {limit:.0f} s; last: {summary}"
    return Step("vLLM engine tests on the GPU", ran.returncode == 0, summary, {"tail": "\n".join(lines[-40:])})


def graphs_step(check: Check) -> Step:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "graphs.json"
        limit = check.limit_s(LIMITS_S["graphs"])
        ran = check.run(graphs_command(out), _env(), limit)
        if ran.returncode != 0 or not out.exists():
            why = f"killed at its limit of {limit:.0f} s" if ran.returncode is None else f"exit {ran.returncode}"
            return Step("CUDA-graph warm-up", False, f"{why}: {_tail(ran)}")
        runs = json.loads(out.read_text())
    graphs, eager = runs["cuda_graphs"], runs["eager"]
    split = all(p in graphs["cold_start_phases_s"] for p in ("weights", "kv_pool", "kernels", "warmup"))
    ok = graphs["enforce_eager"] is False and graphs["decode_tokens"] == eager["decode_tokens"] and split
    speedup = graphs["decode_tokens_per_s"] / eager["decode_tokens_per_s"] if eager["decode_tokens_per_s"] else 0
    phases = graphs["cold_start_phases_s"]
    detail = (
        f"decode {graphs['decode_tokens_per_s']} tok/s with CUDA graphs, {eager['decode_tokens_per_s']} eager "
        f"(x{speedup:.2f}); kernels (compile + graph capture) {phases.get('kernels')} s, "
        f"{eager['cold_start_phases_s'].get('kernels')} s eager; weights {phases.get('weights')} s, "
        f"KV pool {phases.get('kv_pool')} s, warm-up {phases.get('warmup')} s"
    )
    return Step("CUDA-graph warm-up", ok, detail, runs)


def bench_step(check: Check) -> Step:
    limit = check.limit_s(LIMITS_S["bench"])
    ran = check.run(bench_command(), _env(), limit)
    report = check.reports / "worker_vllm_bench_gpu.json"
    if ran.returncode != 0 or not report.exists():
        why = f"killed at its limit of {limit:.0f} s" if ran.returncode is None else f"failed ({ran.returncode})"
        return Step("worker vs AsyncLLM", False, f"bench {why}: {_tail(ran)}")
    summary = json.loads(report.read_text())["summary"]
    rows = [
        f"{a['side']} {a['shape']}: {a['output_tokens_per_s_mean']:.0f} tok/s (ratio {a['ratio_to_direct']})"
        for a in summary
    ]
    return Step("worker vs AsyncLLM", True, "; ".join(rows), {"summary": summary})


# ---- the run --------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="print the steps, their limits and commands; run nothing")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the vLLM engine tests")
    parser.add_argument("--skip-graphs", action="store_true", help="do not compare eager with CUDA graphs")
    parser.add_argument("--skip-bench", action="store_true", help="do not run the worker-vs-AsyncLLM bench")
    parser.add_argument("--out", type=Path, default=REPORTS / "gpu_check.md", help="the Markdown report")
    return parser.parse_args(argv)


def find_gpus(nvml: ModuleType | None = None) -> NodeProfile:
    from llmbus.node.probe import profile_node

    return profile_node(nvml=nvml)


def render(profile: NodeProfile, steps: list[Step], took_s: float) -> str:
    mark = {True: "pass", False: "FAIL", None: "skipped"}
    gpu = profile.gpus[0]
    lines = [
        "# GPU check",
        "",
        f"Command: `{COMMAND}` ({took_s:.0f} s, limit {BUDGET_S} s). Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, {gpu.name} x {len(profile.gpus)}, driver {profile.driver_version}, "
        f"CUDA {profile.cuda_driver_version}.",
        "",
        "| step | outcome | took | detail |",
        "|---|---|---|---|",
    ]
    lines += [f"| {s.name} | {mark[s.ok]} | {s.took_s:.0f} s | {s.detail} |" for s in steps]
    for s in steps:
        if s.data:
            lines += ["", f"## {s.name}", "", "```json", json.dumps(s.data, indent=2, default=str)[:6000], "```"]
    return "\n".join(lines) + "\n"


def _timed(step: Callable[[], Step]) -> Step:
    started = time.monotonic()
    result = step()
    result.took_s = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None, nvml: ModuleType | None = None, check: Check | None = None) -> int:
    args = parse_args(argv)
    if args.plan:
        for name, limit_s, what in plan(args):
            print(f"{name:>6}  within {limit_s:>3} s  {what}")
        print(f"all within {BUDGET_S} s; report: {args.out}")
        return 0
    check = check or Check()
    profile = find_gpus(nvml)
    if not profile.gpus:
        print(
            "gpu-check: no NVIDIA GPU on this machine (NVML found none, or no driver): nothing checked, "
            "no report written. Run it on a GPU host (`make gpu-check` installs vLLM's GPU build); see "
            "services/engine_worker/README.md.",
            file=sys.stderr,
        )
        return NO_GPU_EXIT
    try:
        check_vllm_version(check.installed_vllm())
    except UntestedVllmVersion as exc:
        print(f"gpu-check: {exc}", file=sys.stderr)
        return UNTESTED_VLLM_EXIT
    runners: dict[str, Callable[[], Step]] = {
        "infra": lambda: infra_step(check),
        "node": lambda: node_step(profile),
        "tests": lambda: tests_step(check),
        "graphs": lambda: graphs_step(check),
        "bench": lambda: bench_step(check),
    }
    steps: list[Step] = []
    for name, _, _ in plan(args):
        if name == "bench" and steps[0].ok is False:
            steps.append(Step("worker vs AsyncLLM", False, "not run: Kafka and Redis are not up (step 1)"))
            continue
        steps.append(_timed(runners[name]))
        print(f"{steps[-1].name}: {steps[-1].ok} ({steps[-1].took_s} s) - {steps[-1].detail}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(profile, steps, time.monotonic() - check.started_at))
    args.out.with_suffix(".json").write_text(json.dumps([s.__dict__ for s in steps], indent=2, default=str))
    print(f"wrote {args.out}")
    return 0 if all(s.ok is not False for s in steps) else 1


if __name__ == "__main__":
    sys.exit(main())
