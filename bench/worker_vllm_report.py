"""Constants, aggregation, plot and Markdown of bench.worker_vllm_bench (the runs are there)."""

from __future__ import annotations

import pstats
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from llmbus_tools.harness.vllm_config import TINY_MAX_MODEL_LEN

REPORTS = Path(__file__).parent / "reports"
COMMAND = "python -m bench.worker_vllm_bench"
MAX_NUM_SEQS = 16
PROMPT_WORDS = 48  # ≈ 64 tokens with the tiny tokenizer
TARGET_RATIO = 0.95
WORKER_ID = "bench-vllm-w1"
WORKER_MODULE = "llmbus_services.engine_worker"
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


WARMUP = Shape("warmup", 16, 16)


@dataclass(frozen=True)
class ModelCase:
    """A random-weight Llama to run the comparison on, and the loads for it."""

    name: str
    sizes: dict[str, int]  # overrides of llmbus_tools.harness.tiny_llama.RECIPE
    shapes: tuple[Shape, ...]
    about: str
    # The engine's processes on CPU 1 only, everything else (front-end or worker, broker, bench) on
    # CPU 0, on both sides: the engine computes apart from the control plane, as on a GPU node.
    pinned: bool = False
    report_suffix: str = ""  # e.g. "_gpu": a run elsewhere keeps this machine's reports

    @property
    def stem(self) -> str:
        base = "worker_vllm_bench" if self.name == "tiny" else f"worker_vllm_bench_{self.name}"
        return base + ("_pinned" if self.pinned else "") + self.report_suffix

    @property
    def label(self) -> str:
        return self.name + (", engine pinned to CPU 1" if self.pinned else "")


CASES = {
    "tiny": ModelCase(
        "tiny",
        {},
        (Shape("long", 256, 128), Shape("short", 512, 16)),
        "the test suite's tiny random Llama (hidden 128, 2 layers, ~0.6 M parameters): a forward pass costs "
        "almost nothing, so vLLM's own per-step and per-request CPU work is what the engine spends",
    ),
    "compute": ModelCase(
        "compute",
        {
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
        },
        (Shape("long", 96, 128), Shape("short", 256, 16)),
        "a random Llama (hidden 512, 4 layers, ~14 M parameters) whose decode step for 16 sequences takes "
        "about 10 ms on this CPU, between Llama-3.1-8B's on an H100 (5.8 ms) and on an A100 (16.7 ms) in the "
        "sim's BLIS calibrations: the engine's time goes to the forward pass, as it does on a GPU",
    ),
}


# Where the worker process spends its CPU, by component: (label, file suffix, function). cProfile
# times a coroutine only while it runs, so cumtime is CPU on the event loop, not time spent awaiting.
PROFILE_PARTS = (
    ("dispatch handler, all of it", "engine_worker/flows/dispatch.py", "on_dispatch"),
    ("consumer loop per record (span, metrics, handler)", "llmbus/bus/consumer.py", "_handle"),
    ("vLLM output handler (detokenize, per-request queues)", "v1/engine/async_llm.py", "output_handler"),
    ("vLLM add_request (engine input to the core)", "v1/engine/async_llm.py", "add_request"),
    ("VllmEngine.generate (the wrapper's loop)", "engines/vllm_engine.py", "generate"),
    ("tokenizing prompts (once; generate reuses it)", "engines/vllm_engine.py", "_encode"),
    ("Redis fence: superseded checks (start, then every second)", "llmbus/state/fencing.py", "superseded"),
    ("Redis fence: final claim (SET NX)", "llmbus/state/fencing.py", "claim_final"),
    ("Redis fence: final marked done", "llmbus/state/fencing.py", "final_published"),
    ("Kafka publish (ack awaited: final chunk, result, outcome)", "llmbus/bus/producer.py", "publish"),
    ("Kafka send (token chunks, acks gathered)", "llmbus/bus/producer.py", "send"),
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


def aggregate(rows: list[dict[str, Any]], shapes: tuple[Shape, ...]) -> list[dict[str, Any]]:
    out = []
    for side in dict.fromkeys(r["side"] for r in rows):
        for shape in shapes:
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
        per_request = next(x.max_tokens for x in shapes if x.name == a["shape"]) / 1000
        c, dc = a["cpu_ms_per_1k_tokens"], d["cpu_ms_per_1k_tokens"] if d else None
        a["bus_cpu_ms_per_request"] = (
            round(per_request * (c["frontend"] + c["kafka_broker"] + c["bench_client"] - dc["frontend"]), 2)
            if dc
            else None
        )
    return out


def plot(summary: list[dict[str, Any]], case: ModelCase, path: Path) -> None:
    shapes = case.shapes
    sides = list(dict.fromkeys(a["side"] for a in summary))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.8 / len(sides)
    for k, shape in enumerate(shapes):
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
        ax.set_xticks(range(len(shapes)), [f"{s.name}\n{s.requests} req x {s.max_tokens} tok" for s in shapes])
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
    cores = "engine on CPU 1, the rest on CPU 0" if case.pinned else "2 shared cores"
    fig.suptitle(f"engine-worker vs direct AsyncLLM ({case.name} random Llama, vLLM CPU, {cores})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_markdown(report: dict[str, Any], case: ModelCase, path: Path) -> None:
    s = report["summary"]
    shapes = case.shapes

    def ratios(side: str) -> str:
        return " / ".join(str(a["ratio_to_direct"]) for a in s if a["side"] == side) or "-"

    verdict = ", ".join(
        f"{a['shape']} {a['ratio_to_direct']} ({'met' if a['ratio_to_direct'] >= TARGET_RATIO else 'not met'}; "
        f"{'every' if a['all_runs_below_direct'] else 'not every'} worker run slower than every direct run)"
        for a in s
        if a["side"] == "worker"
    )
    lines = [
        f"# engine-worker vs direct vLLM AsyncLLM ({case.label}; random-weight Llama, vLLM CPU build)",
        "",
        f"Model: {case.about}.",
        "",
        *(
            [
                "Pinned: on both sides the engine's processes (EngineCore and its OpenMP worker) run on CPU 1 "
                "only and everything else (this process or the engine-worker, the Kafka broker, the bench "
                "client) on CPU 0, so the control plane's CPU does not come out of the engine's, as on a GPU "
                "node where the engine computes on the GPU and the host cores serve the rest.",
                "",
            ]
            if case.pinned
            else []
        ),
        f"Command (from the repo root): `{report['command']}` — took {report['took_s']:.0f} s on {report['machine']}.",
        f"1-minute load average {report['load_avg_start']} at the start, {report['load_avg_end']} at the end "
        "(2 cores, shared with the Kafka broker; the load average counts vLLM's spinning threads).",
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
        f"(idle: {report['direct_info']['idle_cpu_cores']['engine_core']} cores with nothing to do). Every "
        "CPU-millisecond the worker, the broker or the client spends is taken from those two cores.",
        (
            "- With this tiny model a forward pass costs almost nothing, so the engine's work is vLLM's own "
            "per-step and per-request Python, as CPU-bound as the worker's; the worker's and broker's CPU comes "
            "straight out of the engine's, and the engine core even burns more CPU per token when it is "
            "preempted (its spin-waits stretch with the wall time; compare its CPU ms per 1k tokens between "
            "`direct` and `worker`). This is the worst case for the ratio; "
            "`python -m bench.worker_vllm_bench --model compute` measures the case where the engine's time "
            "goes to the forward pass, as on a GPU."
            if case.name == "tiny"
            else "- Pinned, the engine's two processes share CPU 1 (the EngineCore's spin-wait against the forward "
            "pass) and the worker, broker and bench share CPU 0; what differs between the sides is only what "
            "reaches the engine and when."
            if case.pinned
            else "- With this model the engine's time goes to the forward pass (the OpenMP worker process), so "
            "what the worker and the broker take mostly displaces the EngineCore process's spin-wait, as on a "
            "GPU node where the engine computes on the GPU and the host cores run the control plane."
        ),
        "- Per request the worker does one Redis EXISTS (two keys) before and one SET after the engine, "
        "tokenizes the prompt once, sends its token chunks without waiting for each ack (all are acknowledged "
        "before the final chunk), then publishes the final chunk, the InferenceResult and the DispatchOutcome, "
        "with an OpenTelemetry span and traceparent per record. That is a fixed cost per request, so short "
        "outputs (16 tokens) lose much more than long ones (128 tokens).",
        "- Chunks per request: `worker` "
        + " / ".join(str(a["chunks_per_request"]) for a in s if a["side"] == "worker")
        + ", `worker_tuned` (longer chunk interval, 10 ms producer linger) "
        + " / ".join(str(a["chunks_per_request"]) for a in s if a["side"] == "worker_tuned")
        + f" (long / short). Ratio long / short: `worker` {ratios('worker')}, `worker_tuned` "
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
            f"## cProfile of the worker process (one `{shapes[1].name}` run + warm-up, "
            f"{shapes[1].requests + WARMUP.requests} requests, default settings)",
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
    lines += [f"![plot]({case.stem}.png)", ""]
    path.write_text("\n".join(lines))
