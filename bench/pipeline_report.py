"""Rows and reports of the pipeline benchmark: percentiles, CPU per request, JSON + Markdown + PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from bench.pipeline_load import Sample

CONTROL_PLANE = ("router", "scheduler", "worker", "broker")


def _pct(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": round(float(np.percentile(values, 50)), 1), "p99": round(float(np.percentile(values, 99)), 1)}


def summarise(
    tree: str,
    engine: str,
    load: str,
    samples: list[Sample],
    window: dict[str, object],
    direct: dict[str, list[float]] | None = None,
    idle: dict[str, object] | None = None,
) -> dict[str, object]:
    if direct is not None:
        first, final = _pct(direct["first_token_ms"]), _pct(direct["final_ms"])
        return {
            "tree": tree,
            "engine": engine,
            "load": load,
            "requests": len(direct["final_ms"]),
            "first_token_ms": first,
            "final_ms": final,
            "headline": f"first token p50 {first['p50']} ms",
        }
    if load == "idle":  # no requests: the fixed cost, in cores (CPU-seconds per second)
        cpu_s_idle: dict[str, float] = window["cpu_s"]  # type: ignore[assignment]
        elapsed_idle_s = float(window["elapsed_s"])  # type: ignore[arg-type]
        return {
            "tree": tree,
            "engine": engine,
            "load": load,
            "cpu_utilisation": {n: round(c / elapsed_idle_s, 3) for n, c in cpu_s_idle.items() if not math.isnan(c)},
            "loadavg": window.get("loadavg"),
        }
    ok = [s for s in samples if s.error is None]
    errors: dict[str, int] = {}
    for s in samples:
        if s.error is not None:
            errors[s.error] = errors.get(s.error, 0) + 1
    elapsed_s = float(window.get("elapsed_s", 0.0)) or 1.0  # type: ignore[arg-type]
    cpu_s: dict[str, float] = window.get("cpu_s", {})  # type: ignore[assignment]
    n = max(1, len(ok))
    cpu_ms_per_request = {name: round(1000 * s / n, 2) for name, s in cpu_s.items() if not math.isnan(s)}
    control_ms = round(sum(cpu_ms_per_request.get(name, 0.0) for name in CONTROL_PLANE), 2)
    # Above idle: the CPU the requests added to what the processes burn with none (polls,
    # heartbeats) - what a busy deployment pays per request once the fixed cost is spread thin.
    marginal_ms: dict[str, float] = {}
    if idle is not None:
        idle_s: dict[str, float] = idle["cpu_s"]  # type: ignore[assignment]
        idle_elapsed_s = float(idle["elapsed_s"])  # type: ignore[arg-type]
        for name, used_s in cpu_s.items():
            fixed_s = idle_s.get(name, 0.0) / idle_elapsed_s * elapsed_s
            if not math.isnan(used_s) and not math.isnan(fixed_s):
                marginal_ms[name] = round(1000 * max(0.0, used_s - fixed_s) / n, 2)
    control_marginal_ms = round(sum(marginal_ms.get(name, 0.0) for name in CONTROL_PLANE), 2)
    first = _pct([s.first_token_ms for s in ok if s.first_token_ms is not None])
    final = _pct([s.final_ms for s in ok if s.final_ms is not None])
    rps = round(len(ok) / elapsed_s, 1)
    return {
        "tree": tree,
        "engine": engine,
        "load": load,
        "requests": len(ok),
        "errors": errors,
        "requests_per_s": rps,
        "first_token_ms": first,
        "final_ms": final,
        "cpu_ms_per_request": cpu_ms_per_request,
        "control_plane_cpu_ms_per_request": control_ms,
        "cpu_ms_per_request_above_idle": marginal_ms,
        "control_plane_cpu_ms_per_request_above_idle": control_marginal_ms,
        "cpu_utilisation": {name: round(s / elapsed_s, 2) for name, s in cpu_s.items() if not math.isnan(s)},
        "loadavg": window.get("loadavg"),
        "headline": f"{rps} req/s, first p50 {first['p50']} / final p99 {final['p99']} ms, "
        f"control-plane CPU {control_ms} ms/request ({control_marginal_ms} above idle), errors {errors or 0}",
    }


def _markdown(rows: list[dict[str, object]], command: str) -> str:
    out = [
        "# Pipeline benchmark: router → scheduler → one worker on the real broker",
        "",
        f"Command: `{command}` (2-core machine shared with other work; local single-node Kafka, Redis).",
        "",
        "CPU is each process's user + system seconds over the measuring window divided by the requests",
        "answered in it (the broker's JVM serves other clients too, so its share is an upper bound).",
        "Latencies are from the client's send to the first content chunk / the final chunk.",
        "",
        "| tree | engine | load | req/s | first p50 / p99 ms | final p50 / p99 ms "
        "| CPU ms/req router · sched · worker · broker = control plane | above idle "
        "| upstream · client | load avg (1 min) | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("load") == "check":
            continue
        if r.get("load") == "idle":
            cores: dict[str, float] = r["cpu_utilisation"]  # type: ignore[assignment]
            idle_load = r.get("loadavg")
            out.append(
                f"| {r['tree']} | {r['engine']} | idle (CPU in cores, no requests) | | | | "
                + " · ".join(str(cores.get(name, "-")) for name in CONTROL_PLANE)
                + f" | | {cores.get('upstream', '-')} · {cores.get('client', '-')} "
                + (f"| {idle_load[0][0]:.2f} → {idle_load[1][0]:.2f} | |" if idle_load else "| | |")  # type: ignore[index]
            )
            continue
        first, final = r["first_token_ms"], r["final_ms"]  # type: ignore[index]
        cpu: dict[str, float] = r.get("cpu_ms_per_request", {})  # type: ignore[assignment]
        load = r.get("loadavg")
        load_txt = f"{load[0][0]:.2f} → {load[1][0]:.2f}" if load else ""  # type: ignore[index]
        cp = (
            " · ".join(str(cpu.get(name, "-")) for name in CONTROL_PLANE)
            + f" = **{r.get('control_plane_cpu_ms_per_request', '-')}**"
            if cpu
            else ""
        )
        out.append(
            f"| {r['tree']} | {r['engine']} | {r['load']} | {r.get('requests_per_s', '')} "
            f"| {first['p50']} / {first['p99']} | {final['p50']} / {final['p99']} | {cp} "  # type: ignore[index]
            f"| {r.get('control_plane_cpu_ms_per_request_above_idle', '')} "
            f"| {cpu.get('upstream', '-')} · {cpu.get('client', '-')} | {load_txt} | {r.get('errors', '') or 0} |"
        )
    out += _queued_section(rows) + _stream_section(rows)
    checks = [r for r in rows if r.get("load") == "check"]
    out += ["", "Exactly one final chunk per request (requests with more than one):", ""]
    out += [f"- {r['tree']} / {r['engine']}: {r['double_finals']}" for r in checks]
    return "\n".join(out) + "\n"


def _three(p: dict[str, float | None]) -> str:
    return f"{p['p50']} / {p['p90']} / {p['p99']}"


def _queued_section(rows: list[dict[str, object]]) -> list[str]:
    """Control-plane queued time of each replay window (bench.pipeline_queued), with the target."""
    replays = [r for r in rows if r.get("queued")]
    if not replays:
        return []
    out = [
        "",
        "## Queued time of the trace replay (target: p99 ≤ 100 ms at ≥ 100 requests/s)",
        "",
        "Queued = received by the router → the engine starts the request (the worker's",
        "`timings.queued_ms` on each result, read from llm.results after the window), split by hop with",
        "the request's Dispatch: router (received → routed), scheduler (routed → Dispatch sent, after its",
        "claim), worker (Dispatch → engine start). Time the engines had no room is not recorded per",
        "request: it is inside the scheduler hop (held until a worker reports room) or shows as a retry,",
        "so these figures include it. All stamps are this machine's wall clock. Room over the window: the",
        "most requests the scheduler held for want of a worker with room (its pool statistics, every 5 s);",
        "as context, the most the engine itself had waiting and its highest KV use at its heartbeats (1/s):",
        "the engine's own queue comes after engine start, outside the queued time.",
        "",
        "| tree | load | sent | results | queued p50 / p90 / p99 ms | router | scheduler | worker "
        "| retried | room: scheduler held · engine waiting · KV use | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in replays:
        q: dict = r["queued"]  # type: ignore[assignment]
        room: dict = r.get("room") or {}  # type: ignore[assignment]
        room_txt = (
            f"{room.get('scheduler_held_max')} · {room.get('engine_waiting_max')} · {room.get('kv_cache_usage_max')}"
            f" ({room.get('verdict')})"
            if room
            else ""
        )
        out.append(
            f"| {r['tree']} | {r['load']} | {q['sent']} | {q['results_read']} | **{_three(q['queued_ms'])}** "
            f"| {_three(q['router_ms'])} | {_three(q['scheduler_ms'])} | {_three(q['worker_ms'])} "
            f"| {q['retried']} | {room_txt} | {q['verdict']} |"
        )
    return out


def _stream_section(rows: list[dict[str, object]]) -> list[str]:
    """Token streaming windows (bench.pipeline_stream), with the targets."""
    streams = [r for r in rows if r.get("stream")]
    if not streams:
        return []
    out = [
        "",
        "## Token streaming through the bus (target: ≥ 100,000 tokens/s, chunk delivery p99 ≤ 50 ms)",
        "",
        "The sim at zero time answering exactly max_tokens, closed loop. Tokens/s: tokens in the chunks",
        "the client received inside the window. Delivery: the client's receive time minus the chunk",
        "record's Kafka timestamp (CreateTime, stamped by the worker's producer at send; one machine's",
        "clock). The worker batches tokens into chunks by its defaults (20 ms or 16 tokens).",
        "",
        "| tree | load | tokens/s | chunks/s | tokens/chunk | delivery p50 / p90 / p99 ms | req/s "
        "| control-plane CPU ms / 1k tokens | tokens/s verdict | delivery verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in streams:
        st: dict = r["stream"]  # type: ignore[assignment]
        out.append(
            f"| {r['tree']} | {r['load']} | **{st['tokens_per_s']:,}** | {st['chunks_per_s']:,} "
            f"| {st['tokens_per_chunk']} | **{_three(st['chunk_delivery_ms'])}** | {r.get('requests_per_s')} "
            f"| {st['control_plane_cpu_ms_per_1k_tokens']} | {st['verdict']['tokens_per_s']} "
            f"| {st['verdict']['chunk_delivery_p99']} |"
        )
    return out


def _plot(rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Streaming rows have their own panel: CPU per 512-token request is not the 3 ms target's.
    measured = [r for r in rows if r.get("cpu_ms_per_request") and not r.get("stream")]
    if not measured:
        return
    labels = [f"{r['tree']}\n{r['engine']}\n{r['load']}" for r in measured]
    fig = plt.figure(figsize=(max(8, len(measured) * 1.1), 12))
    grid = fig.add_gridspec(3, 2)
    ax_cpu, ax_rps = fig.add_subplot(grid[0, :]), fig.add_subplot(grid[1, :])
    bottom = np.zeros(len(measured))
    for name in CONTROL_PLANE:
        values = np.array([r["cpu_ms_per_request"].get(name, 0.0) for r in measured])  # type: ignore[union-attr,attr-defined]
        ax_cpu.bar(labels, values, bottom=bottom, label=name)
        bottom += values
    ax_cpu.axhline(3.0, color="k", linestyle="--", linewidth=1, label="target 3 ms")
    ax_cpu.set_ylabel("control-plane CPU ms / request")
    ax_cpu.legend(fontsize=8)
    ax_cpu.tick_params(axis="x", labelsize=7)
    ax_rps.bar(labels, [r["requests_per_s"] for r in measured], color="tab:gray")  # type: ignore[misc,arg-type]
    ax_rps.set_ylabel("requests / s")
    ax_rps.tick_params(axis="x", labelsize=7)
    _plot_targets(rows, fig.add_subplot(grid[2, 0]), fig.add_subplot(grid[2, 1]))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_targets(rows: list[dict[str, object]], ax_queued, ax_stream) -> None:  # type: ignore[no-untyped-def]
    """Replay queued-time percentiles against 100 ms; streaming tokens/s against 100,000 (chunk p99 noted)."""
    replays = [r for r in rows if r.get("queued")]
    width = 0.25
    for k, q in enumerate(("p50", "p90", "p99")):
        values = [r["queued"]["queued_ms"][q] or 0.0 for r in replays]  # type: ignore[index]
        ax_queued.bar(np.arange(len(replays)) + (k - 1) * width, values, width, label=q)
    ax_queued.axhline(100.0, color="k", linestyle="--", linewidth=1, label="target p99 100 ms")
    ax_queued.set_xticks(np.arange(len(replays)), [f"{r['tree']}\n{r['load']}" for r in replays], fontsize=7)
    ax_queued.set_yscale("log")
    ax_queued.set_ylabel("queued ms (received → engine start)")
    ax_queued.legend(fontsize=7)
    streams = [r for r in rows if r.get("stream")]
    tokens_per_s = [r["stream"]["tokens_per_s"] for r in streams]  # type: ignore[index]
    bars = ax_stream.bar([f"{r['tree']}\n{r['load']}" for r in streams], tokens_per_s, color="tab:green")
    for bar, r in zip(bars, streams, strict=True):
        p99 = r["stream"]["chunk_delivery_ms"]["p99"]  # type: ignore[index]
        ax_stream.annotate(
            f"chunk p99 {p99} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", fontsize=7
        )
    ax_stream.axhline(100_000, color="k", linestyle="--", linewidth=1, label="target 100,000 tokens/s")
    ax_stream.set_ylabel("tokens / s delivered to the client")
    ax_stream.tick_params(axis="x", labelsize=7)
    ax_stream.legend(fontsize=7)


def write_reports(rows: list[dict[str, object]], out: Path, command: str, options: dict[str, object]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    options = {k: v for k, v in options.items() if k != "out"}
    out.with_suffix(".json").write_text(json.dumps({"command": command, "options": options, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(_markdown(rows, command))
    _plot(rows, out.with_suffix(".png"))
    print(_markdown(rows, command))
