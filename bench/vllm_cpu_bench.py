"""Benchmark of the real vLLM engine (CPU build) on the tiny random-weight Llama used by the tests.

    python -m bench.vllm_cpu_bench       # writes bench/reports/vllm_cpu_bench.{json,md,png}

What it measures, through VllmEngine (the worker's code path, not vLLM directly):
1. Cold start: AsyncLLM construction to ready (engine core process, weights, KV cache), then
   the warm-up request.
2. Concurrency sweep: N requests at once (≈64-token prompts, 128 output tokens, ignore_eos):
   TTFT, time per output token and the engine's total output tokens/s.
3. Prefix cache: the same ~300-token prompt twice; cached prompt tokens and TTFT of each.
The model is tiny (hidden 128, 2 layers), so these numbers measure vLLM's per-step overhead
on this CPU, not model compute: read them as an upper bound on what the CPU engine can do.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmConfig, VllmEngine
from llmbus_services.engine_worker.core.engine import EngineRequest
from llmbus_tools.harness.tiny_llama import build_tiny_llama

REPORTS = Path(__file__).parent / "reports"
COMMAND = "python -m bench.vllm_cpu_bench"
CONCURRENCY = [1, 2, 4, 8, 16]  # max_num_seqs 8: at 16 half of them wait a turn
PROMPT_WORDS = 48  # ≈ 64 tokens with the tiny tokenizer
OUTPUT_TOKENS = 128
REPEATS = 3


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def prompt(i: int, words: int = PROMPT_WORDS) -> str:
    vocab = [
        "kafka",
        "broker",
        "topic",
        "partition",
        "offset",
        "consumer",
        "request",
        "token",
        "stream",
        "engine",
        "worker",
        "model",
    ]
    return " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(words)) + f" {i}"


async def one(engine: VllmEngine, rid: str, text: str, max_tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    first = last = None
    tokens = cached = 0
    async for out in engine.generate(EngineRequest(rid, text, max_tokens=max_tokens, temperature=0.0)):
        now = time.perf_counter()
        if first is None and out.new_tokens:
            first = now
        last = now
        tokens, cached = out.completion_tokens, out.cached_prompt_tokens
    assert first is not None and last is not None
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return {
        "ttft_ms": (first - t0) * 1e3,
        "tpot_ms": tpot * 1e3,
        "tokens": tokens,
        "cached": cached,
        "e2e_s": last - t0,
    }


async def sweep(engine: VllmEngine) -> list[dict[str, float]]:
    rows = []
    for n in CONCURRENCY:
        for rep in range(REPEATS):
            t0 = time.perf_counter()
            results = await asyncio.gather(
                *(one(engine, f"c{n}-r{rep}-{i}", prompt(1000 * rep + 10 * n + i), OUTPUT_TOKENS) for i in range(n))
            )
            wall = time.perf_counter() - t0
            row = {
                "concurrency": n,
                "repeat": rep,
                "ttft_ms_mean": statistics.fmean(r["ttft_ms"] for r in results),
                "ttft_ms_max": max(r["ttft_ms"] for r in results),
                "tpot_ms_mean": statistics.fmean(r["tpot_ms"] for r in results),
                "output_tokens": sum(r["tokens"] for r in results),
                "wall_s": wall,
                "output_tokens_per_s": sum(r["tokens"] for r in results) / wall,
            }
            rows.append(row)
            log(
                f"concurrency {n} repeat {rep}: {row['output_tokens_per_s']:.0f} tok/s, "
                f"TTFT {row['ttft_ms_mean']:.1f} ms, TPOT {row['tpot_ms_mean']:.2f} ms"
            )
    return rows


async def prefix(engine: VllmEngine) -> dict[str, float]:
    text = " ".join(prompt(i, 20) for i in range(12))
    cold = await one(engine, "prefix-cold", text, 4)
    warm = await one(engine, "prefix-warm", text, 4)
    result = {
        "prompt_tokens": engine.count_tokens(text),
        "cold_ttft_ms": cold["ttft_ms"],
        "warm_ttft_ms": warm["ttft_ms"],
        "cold_cached_tokens": cold["cached"],
        "warm_cached_tokens": warm["cached"],
    }
    log(f"prefix cache: {result}")
    return result


def plot(rows: list[dict], path: Path) -> None:
    by_n: dict[int, list[dict]] = {}
    for r in rows:
        by_n.setdefault(int(r["concurrency"]), []).append(r)
    ns = sorted(by_n)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(ns, [statistics.fmean(r["output_tokens_per_s"] for r in by_n[n]) for n in ns], "o-")
    a.set_xlabel("concurrent requests")
    a.set_ylabel("output tokens/s (engine total)")
    a.set_title("tiny Llama, vLLM CPU build")
    b.plot(ns, [statistics.fmean(r["ttft_ms_mean"] for r in by_n[n]) for n in ns], "o-", label="TTFT ms")
    b.plot(ns, [statistics.fmean(r["tpot_ms_mean"] for r in by_n[n]) for n in ns], "s-", label="TPOT ms")
    b.set_xlabel("concurrent requests")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(report: dict, path: Path) -> None:
    lines = [
        "# vLLM CPU engine benchmark (tiny random-weight Llama)",
        "",
        f"Command (from the repo root): `{COMMAND}` — took {report['took_s']:.1f} s on {report['machine']}.",
        "",
        f"Model: {report['model']}; vLLM {report['vllm_version']}; max_model_len {report['max_model_len']}; "
        f"KV {report['kv_blocks_total']} blocks x {report['kv_block_size']} tokens.",
        "The model is tiny, so the numbers are vLLM's own per-step overhead on this CPU, not model compute.",
        f"1-minute load average {report['loadavg_1m_start']:.1f} at the start, "
        f"{report['loadavg_1m_end']:.1f} at the end "
        "(the machine is shared: repeats that differ a lot ran while something else used the cores).",
        "",
        f"- Cold start (AsyncLLM built, engine core up, KV allocated): **{report['cold_start_s']:.1f} s**",
        f"- Warm-up request: {report['warmup_s']:.2f} s",
        "",
        f"## Concurrency sweep ({PROMPT_WORDS}-word prompts, {OUTPUT_TOKENS} output tokens, greedy, ignore_eos)",
        "",
        "| N | repeat | output tok/s | TTFT mean ms | TTFT max ms | TPOT mean ms | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["sweep"]:
        lines.append(
            f"| {r['concurrency']} | {r['repeat']} | {r['output_tokens_per_s']:.0f} | {r['ttft_ms_mean']:.1f} | "
            f"{r['ttft_ms_max']:.1f} | {r['tpot_ms_mean']:.2f} | {r['wall_s']:.2f} |"
        )
    p = report["prefix_cache"]
    lines += [
        "",
        "## Prefix cache (same prompt twice)",
        "",
        f"{p['prompt_tokens']} prompt tokens: cached {p['cold_cached_tokens']} then {p['warm_cached_tokens']}; "
        f"TTFT {p['cold_ttft_ms']:.1f} ms then {p['warm_ttft_ms']:.1f} ms.",
        "",
        f"Engine stats at the end: {report['final_stats']}",
        "",
        "![plot](vllm_cpu_bench.png)",
    ]
    path.write_text("\n".join(lines) + "\n")


async def run() -> dict:
    import vllm

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    path = build_tiny_llama()
    engine = VllmEngine(
        VllmConfig(
            model="tiny-llama",
            model_path=str(path),
            dtype="float32",
            max_model_len=512,
            max_num_seqs=8,
            cpu_kvcache_space_gib=1.0,
            ignore_eos=True,
        )
    )
    log("starting vLLM engine ...")
    await engine.start()
    log(f"cold start {engine.cold_start_s:.1f} s")
    t0 = time.perf_counter()
    await engine.warmup()
    warmup_s = time.perf_counter() - t0
    try:
        rows = await sweep(engine)
        prefix_result = await prefix(engine)
        stats = engine.stats()
    finally:
        await engine.stop()
    return {
        "command": COMMAND,
        "machine": f"{platform.machine()} {os.cpu_count()} cores, Python {sys.version.split()[0]}",
        "vllm_version": vllm.__version__,
        "model": f"tiny-llama at {path.name}",
        "max_model_len": engine.max_model_len,
        "kv_blocks_total": stats.kv_blocks_total,
        "kv_block_size": stats.kv_block_size,
        "cold_start_s": engine.cold_start_s,
        "warmup_s": warmup_s,
        "sweep": rows,
        "prefix_cache": prefix_result,
        "final_stats": stats.__dict__,
        "took_s": time.perf_counter() - started,
        # The 2-core machine is shared with other test runs: a high load explains outlier repeats.
        "loadavg_1m_start": load_start,
        "loadavg_1m_end": os.getloadavg()[0],
    }


def main() -> None:
    report = asyncio.run(run())
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "vllm_cpu_bench.json").write_text(json.dumps(report, indent=2))
    plot(report["sweep"], REPORTS / "vllm_cpu_bench.png")
    write_markdown(report, REPORTS / "vllm_cpu_bench.md")
    log(f"wrote {REPORTS}/vllm_cpu_bench.{{json,md,png}}")


if __name__ == "__main__":
    main()
