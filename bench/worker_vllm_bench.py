"""Engine-worker throughput against vLLM's AsyncLLM called directly, same model, same load.

    python -m bench.worker_vllm_bench            # writes bench/reports/worker_vllm_bench.{json,md,png}
    python -m bench.worker_vllm_bench --profile  # also one cProfile'd worker run (adds ~1 min)

Phases run one after the other, never two engines at once (the machine has 2 cores):
1. direct: AsyncLLM in this process (built through VllmEngine, so the engine arguments are the
   worker's), N requests submitted at once; also the same load through VllmEngine.generate
   (the worker's engine wrapper without Kafka).
2. worker: `python -m services.engine_worker` (engine=vllm, same settings) on a fresh topic
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
import json
import os
import platform
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import psutil

from llmbus import topics as t
from llmbus.bus import Bus, decode
from llmbus.bus.admin import ensure_catalog
from llmbus.client import TopicTail
from llmbus.messages import Dispatch, InferenceRequest, InferenceResult, ResultStatus, RoutedRequest
from services.engine_worker.engines.base import EngineRequest
from services.engine_worker.engines.vllm_engine import VllmEngine
from tests.fixtures.tiny_llama import build_tiny_llama
from tests.fixtures.vllm_engine import TINY_MAX_MODEL_LEN, tiny_vllm_config
from tests.support import REPO, fresh_settings, wait_workers_ready

REPORTS = Path(__file__).parent / "reports"
COMMAND = "python -m bench.worker_vllm_bench"
MAX_NUM_SEQS = 16
PROMPT_WORDS = 48  # ≈ 64 tokens with the tiny tokenizer
TARGET_RATIO = 0.95
WORKER_ID = "bench-vllm-w1"
WORKER_MODULE = "services.engine_worker"
OUR_PROCESSES = ("engine_core", "frontend", "kafka_broker", "bench_client")
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
# Fewer, larger chunks (a client still gets its first token at once: the batcher sends it alone) and
# a longer producer linger, so concurrent requests' messages share produce requests to the broker.
TUNED_ENV = {
    "LLMBUS_WORKER_CHUNK_INTERVAL_MS": "100",
    "LLMBUS_WORKER_CHUNK_MAX_TOKENS": "64",
    "LLMBUS_LINGER_MS": "10",
}


@dataclass(frozen=True)
class Shape:
    name: str
    requests: int
    max_tokens: int


SHAPES = (Shape("long", 256, 128), Shape("short", 512, 16))
WARMUP = Shape("warmup", 16, 16)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompt(i: int) -> str:
    vocab = ["kafka", "broker", "topic", "partition", "offset", "consumer", "request", "token", "stream", "engine"]
    return " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(PROMPT_WORDS)) + f" {i}"


def prompts_for(shape: Shape, rep: int) -> list[str]:
    # The same texts on every side; a new set per repeat so no run reuses another's prefix blocks.
    base = 100_000 * rep + 10_000 * SHAPES.index(shape) if shape in SHAPES else 900_000
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


async def direct_phase(repeats: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    for k, v in VLLM_ENV.items():
        os.environ.setdefault(k, v)
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    engine = VllmEngine(tiny_vllm_config(max_num_seqs=MAX_NUM_SEQS))
    t0 = time.perf_counter()
    await engine.start()
    await engine.warmup()
    info = {
        "cold_start_s": round(time.perf_counter() - t0, 1),
        "prompt_tokens": [engine.count_tokens(p) for p in prompts_for(SHAPES[0], 0)[:8]],
    }
    log(f"direct: engine up in {info['cold_start_s']} s; prompt tokens {info['prompt_tokens']}")
    rows: list[dict[str, Any]] = []
    try:
        await run_direct_batch(engine, WARMUP, 0, via_wrapper=False)
        meter = CpuMeter(os.getpid(), bench_is_root=True)
        info["idle_cpu_cores"] = await idle_cpu_cores(meter)
        log(f"direct: idle CPU cores {info['idle_cpu_cores']}")
        for rep in range(repeats):
            for shape in SHAPES:
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
    def __init__(self, env: dict[str, str], profile_path: Path | None) -> None:
        self.settings = fresh_settings()
        self.topics = t.Topics(self.settings.topic_prefix)
        self.metrics_port = _free_port()
        self.log_path = Path("/tmp") / f"{self.settings.topic_prefix}worker-bench.log"
        self.env = env
        self.profile_path = profile_path
        self.module = ["-m", WORKER_MODULE]
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> None:
        env = (
            os.environ
            | VLLM_ENV
            | {
                "LLMBUS_TOPIC_PREFIX": self.settings.topic_prefix,
                "LLMBUS_KAFKA_BOOTSTRAP": self.settings.kafka_bootstrap,
                "LLMBUS_REDIS_URL": self.settings.redis_url,
                "LLMBUS_LOG_JSON": "false",
                "LLMBUS_LOG_LEVEL": "WARNING",
                "LLMBUS_METRICS_PORT": str(self.metrics_port),
                "LLMBUS_WORKER_WORKER_ID": WORKER_ID,
                "LLMBUS_WORKER_ENGINE": "vllm",
                "LLMBUS_WORKER_MODEL": "tiny-llama",
                "LLMBUS_WORKER_VLLM_MODEL_PATH": str(build_tiny_llama()),
                "LLMBUS_WORKER_VLLM_DTYPE": "float32",
                "LLMBUS_WORKER_VLLM_MAX_MODEL_LEN": str(TINY_MAX_MODEL_LEN),
                "LLMBUS_WORKER_VLLM_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
                "LLMBUS_WORKER_VLLM_IGNORE_EOS": "true",
                "LLMBUS_WORKER_VLLM_CPU_KVCACHE_SPACE_GIB": "1",
                "LLMBUS_WORKER_DRAIN_GRACE_S": "1",
                "PYTHONUNBUFFERED": "1",
            }
            | self.env
        )
        prof = ["-m", "cProfile", "-o", str(self.profile_path)] if self.profile_path else []
        with self.log_path.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *prof, *self.module],
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

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
    side: str,
    repeats: int,
    env: dict[str, str],
    shapes: tuple[Shape, ...] = SHAPES,
    profile_path: Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    w = WorkerUnderTest(env, profile_path)
    log(f"{side}: starting the worker (env {env or 'defaults'}), log {w.log_path}")
    rows: list[dict[str, Any]] = []
    bus: Bus | None = None
    try:
        info: dict[str, Any] = {"ready_after_s": await w.start(), "env": env, "topic_prefix": w.settings.topic_prefix}
        log(f"{side}: worker ready after {info['ready_after_s']} s")
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


# Where the worker process spends its CPU, by component: (label, file suffix, function). cProfile
# times a coroutine only while it runs, so cumtime is CPU on the event loop, not time spent awaiting.
PROFILE_PARTS = (
    ("dispatch handler, all of it", "engine_worker/handlers.py", "on_dispatch"),
    ("consumer loop per record (span, metrics, handler)", "llmbus/bus/consumer.py", "_handle"),
    ("vLLM output handler (detokenize, per-request queues)", "v1/engine/async_llm.py", "output_handler"),
    ("vLLM add_request (engine input to the core)", "v1/engine/async_llm.py", "add_request"),
    ("VllmEngine.generate (the wrapper's loop)", "engines/vllm_engine.py", "generate"),
    ("tokenizing prompts (count_tokens + generate: twice)", "engines/vllm_engine.py", "_encode"),
    ("Redis dedupe: is_done x2 per dispatch", "llmbus/state.py", "is_done"),
    ("Redis dedupe: mark_done", "llmbus/state.py", "mark_done"),
    ("Kafka publish (all topics, ack awaited)", "llmbus/bus/producer.py", "publish"),
    ("  of which headers + traceparent", "llmbus/bus/headers.py", "outgoing"),
    ("  of which pydantic JSON", "pydantic/main.py", "model_dump_json"),
    ("aiokafka sender (batches to the broker)", "aiokafka/producer/sender.py", "_send_produce_req"),
    ("Dispatch decode", "llmbus/bus/codec.py", "decode"),
)


def profile_parts(path: Path, requests: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows = []
    for label, file_suffix, func in PROFILE_PARTS:
        calls = cum = 0.0
        for (file, _line, name), (_cc, ncalls, _tt, cumtime, _callers) in stats.items():
            if name == func and file.endswith(file_suffix):
                calls, cum = calls + ncalls, cum + cumtime
        rows.append(
            {
                "part": label,
                "function": f"{file_suffix}:{func}",
                "calls": int(calls),
                "cpu_s": round(cum, 3),
                "cpu_ms_per_request": round(1000 * cum / requests, 3),
            }
        )
    return rows


# ---- report --------------------------------------------------------------------------------


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for side in dict.fromkeys(r["side"] for r in rows):
        for shape in SHAPES:
            mine = [r for r in rows if r["side"] == side and r["shape"] == shape.name]
            if not mine:
                continue
            tps = [r["output_tokens_per_s"] for r in mine]
            cpu_keys = mine[0]["cpu_s"].keys()
            tokens = statistics.fmean(r["output_tokens"] for r in mine)
            out.append(
                {
                    "side": side,
                    "shape": shape.name,
                    "runs": len(mine),
                    "output_tokens_per_s_mean": round(statistics.fmean(tps), 1),
                    "output_tokens_per_s_median": round(statistics.median(tps), 1),
                    "output_tokens_per_s_min": min(tps),
                    "output_tokens_per_s_max": max(tps),
                    "output_tokens_per_s_stdev": round(statistics.stdev(tps), 1) if len(tps) > 1 else 0.0,
                    "requests_per_s_mean": round(statistics.fmean(r["requests_per_s"] for r in mine), 2),
                    "cpu_ms_per_1k_tokens": {
                        k: round(1e6 * statistics.fmean(r["cpu_s"][k] for r in mine) / tokens, 1) for k in cpu_keys
                    },
                    # Cores our processes kept busy: 2.0 means this machine's cores were the limit.
                    "cores_busy_ours": round(
                        statistics.fmean(sum(r["cpu_s"][k] for k in OUR_PROCESSES) / r["wall_s"] for r in mine), 2
                    ),
                    "chunks_per_request": round(statistics.fmean(r["chunks_per_request"] for r in mine), 2)
                    if "chunks_per_request" in mine[0]
                    else None,
                }
            )
    direct = {a["shape"]: a for a in out if a["side"] == "direct"}
    for a in out:
        d = direct.get(a["shape"])
        a["ratio_to_direct"] = round(a["output_tokens_per_s_mean"] / d["output_tokens_per_s_mean"], 3) if d else None
        a["ratio_to_direct_median"] = (
            round(a["output_tokens_per_s_median"] / d["output_tokens_per_s_median"], 3) if d else None
        )
        # Interference on a shared machine only slows runs down: best against best is the least noisy view.
        a["ratio_to_direct_best"] = round(a["output_tokens_per_s_max"] / d["output_tokens_per_s_max"], 3) if d else None
        a["all_runs_below_direct"] = bool(d) and a["output_tokens_per_s_max"] < d["output_tokens_per_s_min"]
        # What the bus adds per request outside the engine core: worker process beyond vLLM's own
        # front-end, plus the broker and the client.
        per_request = next(x.max_tokens for x in SHAPES if x.name == a["shape"]) / 1000
        c, dc = a["cpu_ms_per_1k_tokens"], d["cpu_ms_per_1k_tokens"] if d else None
        a["bus_cpu_ms_per_request"] = (
            round(per_request * (c["frontend"] + c["kafka_broker"] + c["bench_client"] - dc["frontend"]), 2)
            if dc
            else None
        )
    return out


def plot(summary: list[dict[str, Any]], path: Path) -> None:
    sides = list(dict.fromkeys(a["side"] for a in summary))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / len(sides)
    for k, shape in enumerate(SHAPES):
        for j, side in enumerate(sides):
            a = next((a for a in summary if a["side"] == side and a["shape"] == shape.name), None)
            if a is None:
                continue
            x = k + (j - (len(sides) - 1) / 2) * width
            err = [
                [a["output_tokens_per_s_mean"] - a["output_tokens_per_s_min"]],
                [a["output_tokens_per_s_max"] - a["output_tokens_per_s_mean"]],
            ]
            axes[0].bar(
                x,
                a["output_tokens_per_s_mean"],
                width,
                yerr=err,
                capsize=3,
                color=f"C{j}",
                label=side if k == 0 else None,
            )
            axes[1].bar(x, a["ratio_to_direct"], width, color=f"C{j}")
    for ax in axes[:2]:
        ax.set_xticks(range(len(SHAPES)), [f"{s.name}\n{s.requests} req x {s.max_tokens} tok" for s in SHAPES])
    axes[0].set_ylabel("output tokens/s (mean, min-max bars)")
    axes[0].legend(fontsize=8)
    axes[1].axhline(TARGET_RATIO, color="red", ls="--", label=f"target {TARGET_RATIO}")
    axes[1].set_ylabel("throughput / direct AsyncLLM")
    axes[1].legend(fontsize=8)
    keys = ["engine_core", "frontend", "kafka_broker", "bench_client", "other_processes"]
    labels = [f"{a['side']}\n{a['shape']}" for a in summary]
    bottom = [0.0] * len(summary)
    for i, key in enumerate(keys):
        vals = [a["cpu_ms_per_1k_tokens"].get(key, 0.0) for a in summary]
        axes[2].bar(range(len(summary)), vals, bottom=bottom, label=key, color=f"C{i}")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[2].set_xticks(range(len(summary)), labels, fontsize=6, rotation=45, ha="right")
    axes[2].set_ylabel("CPU ms per 1k output tokens")
    axes[2].legend(fontsize=7)
    fig.suptitle("engine-worker vs direct AsyncLLM (tiny Llama, vLLM CPU, 2 shared cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(report: dict[str, Any], path: Path) -> None:
    s = report["summary"]

    def ratios(side: str) -> str:
        return " / ".join(str(a["ratio_to_direct"]) for a in s if a["side"] == side) or "-"

    verdict = ", ".join(
        f"{a['shape']} {a['ratio_to_direct']} ({'met' if a['ratio_to_direct'] >= TARGET_RATIO else 'not met'}; "
        f"{'every' if a['all_runs_below_direct'] else 'not every'} worker run slower than every direct run)"
        for a in s
        if a["side"] == "worker"
    )
    lines = [
        "# engine-worker vs direct vLLM AsyncLLM (tiny random-weight Llama, vLLM CPU build)",
        "",
        f"Command (from the repo root): `{report['command']}` — took {report['took_s']:.0f} s on {report['machine']}.",
        f"1-minute load average {report['load_avg_start']} at the start, {report['load_avg_end']} at the end "
        "(2 cores shared with other engineers' tests and the Kafka broker).",
        "",
        f"Settings on both sides: max_num_seqs {MAX_NUM_SEQS}, max_model_len {TINY_MAX_MODEL_LEN}, float32, "
        "enforce_eager, ignore_eos, greedy, prefix caching on; prompts of "
        f"{min(report['direct_info']['prompt_tokens'])}-{max(report['direct_info']['prompt_tokens'])} tokens. "
        "Throughput = output tokens / wall time from the first submit (publish) to the last finish "
        "(InferenceResult read back from llm.results); every worker run checked exactly one OK result "
        "per request with the full token count.",
        "",
        "| side | shape | runs | output tok/s mean | min - max | req/s | / direct (mean) | / direct (median) | "
        "/ direct (best runs) | "
        "cores busy (ours) | chunks/request | bus CPU ms/request | "
        "CPU ms per 1k tok (engine core / front-end or worker / broker / bench / other) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a in s:
        c = a["cpu_ms_per_1k_tokens"]
        lines.append(
            f"| {a['side']} | {a['shape']} | {a['runs']} | {a['output_tokens_per_s_mean']:.0f} | "
            f"{a['output_tokens_per_s_min']:.0f} - {a['output_tokens_per_s_max']:.0f} | {a['requests_per_s_mean']} | "
            f"{a['ratio_to_direct']} | {a['ratio_to_direct_median']} | {a['ratio_to_direct_best']} | "
            f"{a['cores_busy_ours']} | "
            f"{a['chunks_per_request'] if a['chunks_per_request'] is not None else '-'} | "
            f"{a['bus_cpu_ms_per_request'] if a['side'].startswith('worker') else '-'} | "
            f"{c['engine_core']:.0f} / {c['frontend']:.0f} / {c['kafka_broker']:.0f} / {c['bench_client']:.0f} / "
            f"{c['other_processes']:.0f} |"
        )
    lines += [
        "",
        f"Target: worker ≥ {TARGET_RATIO} of direct; measured {verdict}. "
        "Sides: `direct` = AsyncLLM.generate in this process; "
        "`vllm_engine` = the worker's VllmEngine wrapper, no Kafka; `worker` = the engine-worker process "
        f"with default chunking; `worker_tuned` = env {TUNED_ENV}.",
        "",
        "Columns: *cores busy (ours)* = CPU seconds of the engine core, the front-end or worker process, the "
        "broker and the bench client over the run's wall time (2.0 = both cores). *bus CPU ms/request* = "
        "worker-process CPU beyond the direct front-end's, plus broker and client, per request: what the bus "
        "costs outside the engine core.",
        "",
        "## Reading the numbers",
        "",
        "- The direct side already keeps both cores busy: vLLM's CPU build runs the engine core as two "
        "processes (EngineCore + Worker) that busy-poll shared-memory queues for a second after any activity "
        f"(idle: {report['direct_info']['idle_cpu_cores']['engine_core']} cores with nothing to do), and the "
        "tiny model has almost no compute, so vLLM's per-step and per-request overheads are the work. Every "
        "CPU-millisecond the worker, the broker or the client spends comes out of the engine's share, and the "
        "engine core itself burns more CPU per token when it is preempted (its spin-waits stretch with the "
        "wall time; compare its CPU ms per 1k tokens between `direct` and `worker`).",
        "- Per request the worker does one Redis EXISTS (two keys) before and one SET after the engine, "
        "tokenizes the prompt once, sends its token chunks without waiting for each ack (all are acknowledged "
        "before the final chunk), then publishes the final chunk, the InferenceResult and the DispatchOutcome, "
        "with an OpenTelemetry span and traceparent per record. That is a fixed cost per request, so short "
        "outputs (16 tokens) lose much more than long ones (128 tokens).",
        "- Chunking is a weak lever here: vLLM's DELTA collector merges tokens while a handler waits for an "
        "ack, so chunks per request are already near the floor of ~3 (first token, the rest, final). Ratio "
        f"long / short: `worker` {ratios('worker')}, `worker_tuned` (longer chunk interval, 10 ms linger) "
        f"{ratios('worker_tuned')}.",
        "- On a GPU node the engine's work runs on the GPU and the host has spare cores for the worker's "
        "event loop and Kafka client; the ratio there cannot be measured on this machine.",
        "",
    ]
    lines += [
        "## Runs",
        "",
        "| side | shape | rep | tok/s | wall s | worker done s | load 1m | published |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['side']} | {r['shape']} | {r['repeat']} | {r['output_tokens_per_s']:.0f} | {r['wall_s']} | "
            f"{r.get('worker_done_s', '-')} | {r['load_avg_1m']} | {r.get('published', '-')} |"
        )
    lines += [
        "",
        f"Cold starts: direct {report['direct_info']['cold_start_s']} s; "
        + "; ".join(f"{k} ready after {v['ready_after_s']} s" for k, v in report["worker_info"].items()),
        "",
    ]
    if report.get("profile"):
        lines += [
            f"## cProfile of the worker process (one `{SHAPES[1].name}` run + warm-up, "
            f"{SHAPES[1].requests + WARMUP.requests} requests, default settings)",
            "",
            "CPU on the worker's event loop by component (cumulative, so nested rows overlap; profiling "
            "itself inflates every number, read them relative to each other).",
            "",
            "| part | function | calls | CPU s | CPU ms per request |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {e['part']} | `{e['function']}` | {e['calls']} | {e['cpu_s']} | {e['cpu_ms_per_request']} |"
            for e in report["profile"]
        ]
        lines.append("")
    lines += ["![plot](worker_vllm_bench.png)", ""]
    path.write_text("\n".join(lines))


async def main(repeats: int, profile: bool) -> None:
    started = time.perf_counter()
    load_start = round(os.getloadavg()[0], 2)
    command = COMMAND + (" --profile" if profile else "") + (f" --repeats {repeats}" if repeats != 3 else "")
    log(f"worker vs direct vLLM bench: {repeats} repeats x {[s.name for s in SHAPES]}; load {load_start}")
    runs, direct_info = await direct_phase(repeats)
    worker_info: dict[str, Any] = {}
    for side, env in (("worker", {}), ("worker_tuned", TUNED_ENV)):
        rows, worker_info[side] = await worker_phase(side, repeats, env)
        runs += rows
    profile_rows: list[dict[str, Any]] = []
    if profile:
        prof_path = Path("/tmp") / f"worker-vllm-bench-{uuid.uuid4().hex[:6]}.prof"
        # The short shape: where the per-request cost of the worker shows most.
        rows, worker_info["worker_profiled"] = await worker_phase("worker_profiled", 1, {}, (SHAPES[1],), prof_path)
        profile_rows = profile_parts(prof_path, SHAPES[1].requests + WARMUP.requests)
        worker_info["worker_profiled"]["runs"] = rows
    summary = aggregate(runs)
    report = {
        "command": command,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}",
        "took_s": round(time.perf_counter() - started, 1),
        "load_avg_start": load_start,
        "load_avg_end": round(os.getloadavg()[0], 2),
        "shapes": [s.__dict__ for s in SHAPES],
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
    (REPORTS / "worker_vllm_bench.json").write_text(json.dumps(report, indent=2))
    plot(summary, REPORTS / "worker_vllm_bench.png")
    write_markdown(report, REPORTS / "worker_vllm_bench.md")
    for a in summary:
        log(
            f"{a['side']:>13} {a['shape']:>5}: {a['output_tokens_per_s_mean']:.0f} tok/s "
            f"(min {a['output_tokens_per_s_min']:.0f}, max {a['output_tokens_per_s_max']:.0f}) "
            f"ratio {a['ratio_to_direct']}"
        )
    log(f"done in {report['took_s']} s; wrote {REPORTS}/worker_vllm_bench.{{json,md,png}}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="one more worker run under cProfile")
    args = parser.parse_args()
    asyncio.run(main(args.repeats, args.profile))
