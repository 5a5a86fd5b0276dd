"""Engine-worker throughput against vLLM's AsyncLLM called directly, same model, same load.

    python -m bench.worker_vllm_bench                  # both models, one after the other
    python -m bench.worker_vllm_bench --model tiny     # bench/reports/worker_vllm_bench.{json,md,png}
    python -m bench.worker_vllm_bench --model compute  # bench/reports/worker_vllm_bench_compute.{json,md,png}
    python -m bench.worker_vllm_bench --profile        # also one cProfile'd worker run each (adds ~1 min)
    python -m bench.worker_vllm_bench --model compute --pin   # engine on CPU 1, the rest on CPU 0 (..._pinned)

Two random-weight Llamas: `tiny` (the test suite's; a forward pass costs nothing, so vLLM's
own Python is the engine's work: the worst case for the ratio on 2 shared cores) and
`compute` (a decode step of 16 sequences takes ~10 ms, between Llama-3.1-8B's on an H100
and an A100: the engine's time goes to the forward pass, as on a GPU).

Phases run one after the other, never two engines at once (the machine has 2 cores):
1. direct: AsyncLLM in this process (built through VllmEngine, so the engine arguments are the
   worker's), N requests submitted at once; also the same load through VllmEngine.generate
   (the worker's engine wrapper without Kafka).
2. worker: `python -m llmbus_services.engine_worker` (engine=vllm, same settings) on a fresh topic
   namespace; N Dispatch messages written straight onto its dispatch topic, wall time from the
   first publish to the last InferenceResult read back from llm.results.
3. worker, tuned: the same with fewer, larger token chunks and a longer producer linger (env
   only, no code change).
Throughput is output tokens / wall time; CPU seconds of each process are sampled around every
run, so the report can say where the cores went (engine core, front-end / worker, broker, rest).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import psutil

from bench.worker_vllm_report import (
    CASES,
    COMMAND,
    MAX_NUM_SEQS,
    PROMPT_WORDS,
    REPORTS,
    TARGET_RATIO,
    TUNED_ENV,
    VLLM_ENV,
    WARMUP,
    WORKER_ID,
    WORKER_MODULE,
    ModelCase,
    Shape,
    aggregate,
    plot,
    profile_parts,
    write_markdown,
)
from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import Dispatch, InferenceRequest, InferenceResult, ResultStatus, RoutedRequest
from llmbus.process.launch import bus_env, spawn_module
from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest
from llmbus_tools.harness.service_procs import REPO, fresh_settings, wait_workers_ready
from llmbus_tools.harness.tiny_llama import build_tiny_llama
from llmbus_tools.harness.vllm_config import TEST_GPU_MEMORY_UTILIZATION, TINY_MAX_MODEL_LEN, tiny_vllm_config


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompt(i: int) -> str:
    vocab = ["kafka", "broker", "topic", "partition", "offset", "consumer", "request", "token", "stream", "engine"]
    return " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(PROMPT_WORDS)) + f" {i}"


def prompts_for(shape: Shape, rep: int) -> list[str]:
    # The same texts on every side; a new set per repeat so no run reuses another's prefix blocks.
    base = 100_000 * rep + 10_000 * (shape.name != "long") if shape is not WARMUP else 900_000
    return [prompt(base + i) for i in range(shape.requests)]


# ---- CPU accounting ------------------------------------------------------------------------


def _cpu_s(proc: psutil.Process) -> float:
    try:
        c = proc.cpu_times()
        return c.user + c.system
    except psutil.Error:
        return 0.0


def _kafka_broker() -> psutil.Process | None:
    for proc in psutil.process_iter(["cmdline"]):
        if "kafka.Kafka" in (proc.info.get("cmdline") or []):
            return proc
    return None


class CpuMeter:
    """CPU seconds used during one run by: the front-end (root pid), its children, the broker, the rest."""

    def __init__(self, root_pid: int, bench_is_root: bool) -> None:
        self.root = psutil.Process(root_pid)
        self.me = psutil.Process()
        self.bench_is_root = bench_is_root
        self.broker = _kafka_broker()

    def snapshot(self) -> dict[str, float]:
        children = self.root.children(recursive=True)
        sys_cpu = psutil.cpu_times()
        return {
            "frontend": _cpu_s(self.root),
            "engine_core": sum(_cpu_s(c) for c in children),
            "kafka_broker": _cpu_s(self.broker) if self.broker else 0.0,
            "bench_client": 0.0 if self.bench_is_root else _cpu_s(self.me),
            "_busy": sys_cpu.user + sys_cpu.system + sys_cpu.nice + getattr(sys_cpu, "irq", 0) + sys_cpu.softirq,
        }

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        d = {k: max(0.0, after[k] - before[k]) for k in before}
        busy = d.pop("_busy")
        d["other_processes"] = max(0.0, busy - sum(d.values()))
        return {k: round(v, 3) for k, v in d.items()}


async def idle_cpu_cores(meter: CpuMeter, seconds: float = 1.0) -> dict[str, float]:
    """CPU cores each part uses with no request in flight (vLLM's CPU engine core polls while idle)."""
    before = meter.snapshot()
    await asyncio.sleep(seconds)
    return {k: round(v / seconds, 2) for k, v in meter.delta(before, meter.snapshot()).items()}


def summarize(
    side: str, shape: Shape, rep: int, wall_s: float, tokens: int, cpu: dict[str, float], **extra: Any
) -> dict[str, Any]:
    row = {
        "side": side,
        "shape": shape.name,
        "repeat": rep,
        "requests": shape.requests,
        "max_tokens": shape.max_tokens,
        "output_tokens": tokens,
        "wall_s": round(wall_s, 4),
        "output_tokens_per_s": round(tokens / wall_s, 1),
        "requests_per_s": round(shape.requests / wall_s, 2),
        "cpu_s": cpu,
        "load_avg_1m": round(os.getloadavg()[0], 2),
        **extra,
    }
    log(
        f"  {side:>13} {shape.name:>5} rep {rep}: {row['output_tokens_per_s']:7.0f} tok/s "
        f"{row['requests_per_s']:6.1f} req/s wall {wall_s:.2f}s load {row['load_avg_1m']} cpu {cpu}"
        + (f" published {extra['published']}" if "published" in extra else "")
    )
    return row


def pin(pid: int, cpus: set[int], with_children: bool) -> None:
    """Every thread of `pid` (and of its descendants) onto `cpus`; new threads inherit it."""
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)] if with_children else [root]:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, PermissionError):
                pass  # a thread that just ended


def pin_engine_apart(front_end_pid: int) -> None:
    """The engine's processes (children of the front-end) on CPU 1, the front-end and the broker on CPU 0."""
    for child in psutil.Process(front_end_pid).children(recursive=True):
        pin(child.pid, {1}, with_children=False)
    pin(front_end_pid, {0}, with_children=False)
    broker = _kafka_broker()
    if broker is not None:
        pin(broker.pid, {0}, with_children=False)
    pin(os.getpid(), {0}, with_children=False)


# ---- direct --------------------------------------------------------------------------------


async def run_direct_batch(engine: VllmEngine, shape: Shape, rep: int, via_wrapper: bool) -> tuple[float, int]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    llm = engine._llm  # the AsyncLLM VllmEngine built: the very engine arguments the worker uses
    params = SamplingParams(
        max_tokens=shape.max_tokens, temperature=0.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    tokenizer = llm.get_tokenizer()
    tag = uuid.uuid4().hex[:6]

    async def raw(i: int, text: str) -> int:
        (engine_input,) = llm.renderer.render_cmpl([{"prompt_token_ids": list(tokenizer.encode(text))}])
        n = 0
        async for out in llm.generate(engine_input, params, f"d-{tag}-{i}"):
            n += len(out.outputs[0].token_ids)
        return n

    async def wrapped(i: int, text: str) -> int:
        n = 0
        async for out in engine.generate(
            EngineRequest(f"e-{tag}-{i}", text, max_tokens=shape.max_tokens, temperature=0.0)
        ):
            n = out.completion_tokens
        return n

    one = wrapped if via_wrapper else raw
    t0 = time.perf_counter()
    counts = await asyncio.gather(*(one(i, text) for i, text in enumerate(prompts_for(shape, rep))))
    wall = time.perf_counter() - t0
    assert all(c == shape.max_tokens for c in counts), f"ignore_eos: every output is {shape.max_tokens} tokens"
    return wall, sum(counts)


async def direct_phase(case: ModelCase, repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    for k, v in VLLM_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    # enforce_eager=None: the platform's default, as the worker's (eager on the CPU build, CUDA graphs on GPU).
    config = tiny_vllm_config(
        max_num_seqs=MAX_NUM_SEQS, model_path=str(build_tiny_llama(**case.sizes)), enforce_eager=None
    )
    engine = VllmEngine(config)
    t0 = time.perf_counter()
    await engine.start()
    if case.pinned:
        pin_engine_apart(os.getpid())
    await engine.warmup()
    info = {
        "cold_start_s": round(time.perf_counter() - t0, 1),
        "prompt_tokens": [engine.count_tokens(p) for p in prompts_for(case.shapes[0], 0)[:8]],
    }
    log(f"direct: engine up in {info['cold_start_s']} s; prompt tokens {info['prompt_tokens']}")
    rows: list[dict[str, Any]] = []
    try:
        await run_direct_batch(engine, WARMUP, 0, via_wrapper=False)
        meter = CpuMeter(os.getpid(), bench_is_root=True)
        info["idle_cpu_cores"] = await idle_cpu_cores(meter)
        log(f"direct: idle CPU cores {info['idle_cpu_cores']}")
        for rep in range(repeats):
            for shape in case.shapes:
                # Alternate which goes first, so neither side always runs right after an idle pause.
                order = (("direct", False), ("vllm_engine", True))
                for side, wrapper in order if rep % 2 == 0 else order[::-1]:
                    before = meter.snapshot()
                    wall, tokens = await run_direct_batch(engine, shape, rep, via_wrapper=wrapper)
                    rows.append(summarize(side, shape, rep, wall, tokens, meter.delta(before, meter.snapshot())))
    finally:
        await engine.stop()
    return rows, info


# ---- worker --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def published_counts(port: int) -> dict[str, float]:
    """The worker's own llmbus_messages_published_total, by topic base name (tokens, results, ...)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llmbus_messages_published_total{"):
            labels, value = line.rsplit(" ", 1)
            topic = labels.split('topic="', 1)[1].split('"', 1)[0]
            base = topic.split("llm.", 1)[-1].split(".", 1)[0]
            counts[base] = counts.get(base, 0.0) + float(value)
    return counts


class WorkerUnderTest:
    def __init__(self, model_path: Path, env: dict[str, str], profile_path: Path | None) -> None:
        self.model_path = model_path
        self.settings = fresh_settings()
        self.topics = t.Topics(self.settings.topic_prefix)
        self.metrics_port = _free_port()
        self.log_path = Path("/tmp") / f"{self.settings.topic_prefix}worker-bench.log"
        self.env = env
        self.profile_path = profile_path
        self.module = WORKER_MODULE
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> None:
        env = (
            os.environ
            | VLLM_ENV
            | bus_env(self.settings)
            | {
                "LLMBUS_LOG_LEVEL": "WARNING",
                "LLMBUS_METRICS_PORT": str(self.metrics_port),
                "LLMBUS_WORKER_WORKER_ID": WORKER_ID,
                "LLMBUS_WORKER_ENGINE": "vllm",
                "LLMBUS_WORKER_MODEL": "tiny-llama",
                "LLMBUS_WORKER_VLLM_MODEL_PATH": str(self.model_path),
                "LLMBUS_WORKER_VLLM_DTYPE": "float32",
                "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": str(TINY_MAX_MODEL_LEN),
                "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
                "LLMBUS_WORKER_VLLM_IGNORE_EOS": "true",
                "LLMBUS_WORKER_VLLM_CPU_KVCACHE_SPACE_GIB": "1",
                # the direct side's share of a GPU (tiny_vllm_config); the CPU build ignores it
                "LLMBUS_WORKER_VLLM_GPU_MEMORY_UTILIZATION": str(TEST_GPU_MEMORY_UTILIZATION),
                "LLMBUS_WORKER_DRAIN_GRACE_S": "1",
            }
            | self.env
        )
        prof = ["-m", "cProfile", "-o", str(self.profile_path)] if self.profile_path else []
        self.proc = spawn_module(self.module, env=env, log_path=self.log_path, cwd=REPO, python_args=prof)

    async def start(self) -> float:
        """Start the worker process; seconds until its heartbeat says ready."""
        await ensure_catalog(self.settings)
        t0 = time.perf_counter()
        self._spawn()
        await wait_workers_ready(self.settings, {WORKER_ID}, timeout_s=240)
        return round(time.perf_counter() - t0, 1)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # graceful: cProfile writes its file on a clean exit
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


async def run_worker_batch(
    w: WorkerUnderTest, bus: Bus, shape: Shape, rep: int, meter: CpuMeter | None = None
) -> dict[str, Any]:
    results = await TopicTail(w.settings, w.topics.name(t.RESULTS)).start()
    tag = uuid.uuid4().hex[:6]
    dispatches = []
    for i, text in enumerate(prompts_for(shape, rep)):
        request = InferenceRequest(
            request_id=f"w-{tag}-{i}", prompt=text, max_tokens=shape.max_tokens, temperature=0.0, model="tiny-llama"
        )
        dispatches.append(Dispatch(routed=RoutedRequest(request=request, model="tiny-llama"), worker_id=WORKER_ID))
    wanted = {d.request_id for d in dispatches}
    seen: dict[str, InferenceResult] = {}
    duplicates = foreign = 0
    cpu_after: dict[str, float] = {}
    last_at = 0.0
    try:
        t0 = time.perf_counter()
        t0_ms = time.time() * 1000
        await asyncio.gather(
            *(bus.publisher.publish(w.topics.dispatch(WORKER_ID), d, key=d.request_id) for d in dispatches)
        )
        async for record in results.records(120):
            result = decode(record, InferenceResult)
            if result.request_id not in wanted:
                foreign += 1
            elif result.request_id in seen:
                duplicates += 1
            else:
                seen[result.request_id] = result
                last_at = time.perf_counter()
                if len(seen) == len(wanted):
                    cpu_after = meter.snapshot() if meter else {}
                    break
        # A short look past the last one: a second result for a request id would show up here.
        async for record in results.records(0.4):
            duplicates += decode(record, InferenceResult).request_id in seen
    finally:
        await results.stop()
    if len(seen) != len(wanted):
        raise RuntimeError(f"{shape.name} rep {rep}: {len(seen)}/{len(wanted)} results within 120 s")
    bad = [
        r.request_id
        for r in seen.values()
        if r.status != ResultStatus.OK or r.usage.completion_tokens != shape.max_tokens
    ]
    if bad or duplicates:
        raise RuntimeError(f"{shape.name} rep {rep}: {len(bad)} bad results, {duplicates} duplicates")
    return {
        "wall_s": last_at - t0,
        "tokens": sum(r.usage.completion_tokens for r in seen.values()),
        # Last completed_at as stamped by the worker: wall time without the bench's consumer latency.
        "worker_done_s": round((max(r.completed_at_ms for r in seen.values()) - t0_ms) / 1000, 4),
        "results_per_request": 1.0 if not duplicates else 1 + duplicates / len(wanted),
        "foreign_results": foreign,
        "cpu_after": cpu_after,
    }


async def worker_phase(
    case: ModelCase,
    side: str,
    repeats: int,
    env: dict[str, str],
    shapes: tuple[Shape, ...] | None = None,
    profile_path: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    shapes = shapes or case.shapes
    w = WorkerUnderTest(build_tiny_llama(**case.sizes), env, profile_path)
    log(f"{side}: starting the worker (env {env or 'defaults'}), log {w.log_path}")
    rows: list[dict[str, Any]] = []
    bus: Bus | None = None
    try:
        info: dict[str, Any] = {"ready_after_s": await w.start(), "env": env, "topic_prefix": w.settings.topic_prefix}
        log(f"{side}: worker ready after {info['ready_after_s']} s")
        assert w.proc is not None
        if case.pinned:
            pin_engine_apart(w.proc.pid)
        bus = await Bus.start(w.settings, "bench")
        await run_worker_batch(w, bus, WARMUP, 0)
        assert w.proc is not None
        meter = CpuMeter(w.proc.pid, bench_is_root=False)
        info["idle_cpu_cores"] = await idle_cpu_cores(meter)
        log(f"{side}: idle CPU cores {info['idle_cpu_cores']}")
        for rep in range(repeats):
            for shape in shapes:
                counts_before, before = published_counts(w.metrics_port), meter.snapshot()
                out = await run_worker_batch(w, bus, shape, rep, meter)
                cpu = meter.delta(before, out["cpu_after"])
                counts_after = published_counts(w.metrics_port)
                published = {k: int(v - counts_before.get(k, 0.0)) for k, v in counts_after.items()}
                published = {k: v for k, v in published.items() if v and k != "workers"}
                rows.append(
                    summarize(
                        side,
                        shape,
                        rep,
                        out["wall_s"],
                        out["tokens"],
                        cpu,
                        worker_done_s=out["worker_done_s"],
                        published=published,
                        chunks_per_request=round(published.get("tokens", 0) / shape.requests, 2),
                        results_per_request=out["results_per_request"],
                    )
                )
                await asyncio.sleep(0.3)  # let the last acks and commits settle
    finally:
        if bus is not None:
            await bus.stop()
        await asyncio.to_thread(w.stop)
    return rows, info


async def main(case: ModelCase, repeats: int, profile: bool) -> None:
    started = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)
    command = (
        COMMAND
        + (f" --model {case.name}" if case.name != "tiny" else "")
        + (" --pin" if case.pinned else "")
        + (" --profile" if profile else "")
        + (f" --repeats {repeats}" if repeats != 3 else "")
        + (f" --report-suffix {case.report_suffix}" if case.report_suffix else "")
    )
    log(f"worker vs direct vLLM bench, {case.name} model: {repeats} repeats x {[s.name for s in case.shapes]}")
    runs, direct_info = await direct_phase(case, repeats)
    worker_info: dict[str, Any] = {}
    for side, env in (("worker", {}), ("worker_tuned", TUNED_ENV)):
        rows, worker_info[side] = await worker_phase(case, side, repeats, env)
        runs += rows
    profile_rows: list[dict[str, Any]] = []
    if profile:
        prof_path = Path("/tmp") / f"worker-vllm-bench-{uuid.uuid4().hex[:6]}.prof"
        # The short shape: where the per-request cost of the worker shows most.
        short = case.shapes[1]
        rows, worker_info["worker_profiled"] = await worker_phase(case, "worker_profiled", 1, {}, (short,), prof_path)
        profile_rows = profile_parts(prof_path, short.requests + WARMUP.requests)
        worker_info["worker_profiled"]["runs"] = rows
    summary = aggregate(runs, case.shapes)
    report = {
        "command": command,
        "model_case": {"name": case.name, "sizes": case.sizes, "about": case.about},
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "took_s": round(time.perf_counter() - started, 1),
        "load_avg_start": load_start,
        "load_avg_end": round(os.getloadavg()[0], 2),
        "shapes": [s.__dict__ for s in case.shapes],
        "max_num_seqs": MAX_NUM_SEQS,
        "target_ratio": TARGET_RATIO,
        "tuned_env": TUNED_ENV,
        "direct_info": direct_info,
        "worker_info": worker_info,
        "summary": summary,
        "runs": runs,
        "profile": profile_rows,
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / f"{case.stem}.json").write_text(json.dumps(report, indent=2))
    plot(summary, case, REPORTS / f"{case.stem}.png")
    write_markdown(report, case, REPORTS / f"{case.stem}.md")
    for a in summary:
        log(
            f"{a['side']:>13} {a['shape']:>5}: {a['output_tokens_per_s_mean']:.0f} tok/s "
            f"(min {a['output_tokens_per_s_min']:.0f}, max {a['output_tokens_per_s_max']:.0f}) "
            f"ratio {a['ratio_to_direct']}"
        )
    log(f"done in {report['took_s']} s; wrote {REPORTS}/{case.stem}.{{json,md,png}}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=[*sorted(CASES), "all"], default="all", help="all: each in turn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more worker run under cProfile")
    parser.add_argument("--pin", action="store_true", help="engine on CPU 1, everything else on CPU 0")
    parser.add_argument("--report-suffix", default="", help="appended to the report names (e.g. _gpu)")
    args = parser.parse_args()
    for name in CASES if args.model == "all" else (args.model,):
        case = dataclasses.replace(CASES[name], pinned=args.pin, report_suffix=args.report_suffix)
        asyncio.run(main(case, args.repeats, args.profile))
