"""The autoscaler benchmark's report: a table per trace against the targets, and one PNG of every day.

    python -m bench.autoscaler_report [--notes bench/reports/autoscaler_notes.md]

rewrites bench/reports/autoscaler.md from autoscaler.json, with the notes file's reading of that run
(what stands between each figure and its target) after the tables; the bench itself writes the same
page (with `--notes`) at the end of a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.autoscaler_replay import DayResult

TARGETS = {"ttft_ms": 2000.0, "attainment": 0.99, "gpu_ratio": 0.7, "cold_start_share": 0.05}


def _row(r: dict) -> str:
    return (
        f"| {r['policy']} | {r['slo_attainment']:.2%} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
        f"{r['gpu_hours']:.0f} | {r['gpu_hours_vs_static']:.2f}x | {r['cold_start_gpu_hours']:.1f} "
        f"({r['cold_start_share']:.1%}) | {r['scale_events']} ({r['scale_events_per_hour']:.1f}/h) | {r['flaps']} |"
    )


def _static_outcome(r: dict) -> str:
    if r["gave_up_at_h"] is not None:
        return f"missed (given up at {r['gave_up_at_h']:g} h)"
    return f"{r['slo_attainment']:.2%}"


def _trace_section(t: dict, targets: dict) -> list[str]:
    p = t["results"][-1]
    verdict = t["targets_met"]
    checks = [
        ("TTFT <= 2 s", f"{p['slo_attainment']:.2%} (>= {targets['attainment']:.0%})", verdict["attainment"]),
        ("GPU-hours vs static", f"{p['gpu_hours_vs_static']:.2f}x (<= {targets['gpu_ratio']}x)", verdict["gpu_ratio"]),
        (
            "cold-start share",
            f"{p['cold_start_share']:.1%} (<= {targets['cold_start_share']:.0%})",
            verdict["cold_start_share"],
        ),
        ("no flapping", f"{p['flaps']} reversals, {p['scale_events_per_hour']:.1f} events/h", verdict["no_flapping"]),
    ]
    statics = ", ".join(f"{r['replicas']}: {_static_outcome(r)}" for r in t["static_candidates"])
    tuning = ", ".join(
        f"{r['share']:g}: {r['slo_attainment']:.2%} / {r['gpu_hours']:.0f} GPU-h" for r in t["tuning_day"]
    )
    return [
        f"## {t['trace']}: {t['shape']}",
        "",
        f"`data/traces/{t['file']}`, daytime base {t['base_rate_per_s']:g} req/s (peaks 4x); judged day "
        f"{t['requests']['judged_day']:,} requests, tuning day {t['requests']['tuning_day']:,}.",
        "",
        "| policy | TTFT <= 2 s | TTFT p50 ms | TTFT p99 ms | GPU-hours | vs static | cold-start GPU-h | "
        "scale events | flaps |",
        "|---|---|---|---|---|---|---|---|---|",
        *[_row(r) for r in t["results"]],
        "",
        "| target (predictive, judged day) | figure | met |",
        "|---|---|---|",
        *[f"| {name} | {figure} | {'yes' if ok else '**no**'} |" for name, figure, ok in checks],
        "",
        f"Static fleets replayed on the judged day (workers: TTFT <= 2 s): {statics}.",
        f"Tuning day, predictive per burst_late_share (TTFT <= 2 s / GPU-hours): {tuning}; "
        f"{t['share_chosen']:g} judged.",
        f"Predictive scale events by rule: {p['scale_events_by_rule']}.",
        "",
    ]


def write_markdown(path: Path, report: dict, png_name: str, notes: str = "") -> None:
    s = report["settings"]
    targets = report["targets"]
    lines = [
        "# Autoscaler: three traffic shapes, tuned on one day and judged on another",
        "",
        f"Command: `{report['command']}` ({report['bench_wall_s']} s of wall time with --processes "
        f"{s['processes']}; load average {report['load_average_1m']} at the end).",
        "",
        "Each trace's first half is warped onto a tidal day (night at 0.2x the daytime base, 4x peaks 10-12 h and "
        "14-17 h) to tune on, its second half onto another to judge on. Replays run in virtual time through the real "
        "`SchedulerCore` (pipeline `bench/autoscaler_pipeline.yaml`) and the real policies, on workers whose engines "
        f"are SimCore's step loop with the `{s['profile']}` profile ({s['slots']} batch slots, chunked prefill of "
        f"8192 tokens a step; bench/autoscaler_engine.py, held to SimCore step for step by "
        f"tests/unit/test_autoscaler_engine.py) and a {s['cold_start_s']:.0f} s cold start. GPU-hours count every "
        "GPU of a worker (tensor parallel) from its start, cold start included, to the end of its drain.",
        "",
        f"Targets on every judged day, for the predictive policy: >= {targets['attainment']:.0%} of requests with "
        f"TTFT <= {targets['ttft_ms'] / 1000:g} s; <= {targets['gpu_ratio']}x the GPU-hours of the smallest static "
        "fleet that meets the same SLO on that day; cold-start GPU-hours <= "
        f"{targets['cold_start_share']:.0%} of the total; no flapping (a scale-down undone by a scale-up, or the "
        "reverse, within two cold starts).",
        "",
        "- static: the smallest fixed fleet meeting the SLO on the judged day, searched (a fleet that misses is given "
        "up on once more requests are late than 1 % of the day).",
        "- threshold: the design source's rule with its numbers, untuned: median queue wait > 300 ms or p99 TTFT > "
        "2 s for 3 min → +1, 5 min cooldown, 10 min without traffic → the minimum (1).",
        "- predictive: its `burst_late_share` (the share of requests its burst sizing may leave late) chosen "
        f"on the tuning day (the largest of {s['tune_shares']} meeting the SLO there: the fewest workers); "
        "everything else the same on every trace "
        f"({', '.join(f'{k} {v:g}' for k, v in s['predictive_params'].items())}), its engine model the "
        "workers' profile, its daily pattern the day before (the tuning day).",
        "",
    ]
    for t in report["traces"]:
        lines += _trace_section(t, targets)
    lines += (
        [notes.strip(), "", f"![timelines]({png_name})", ""] if notes.strip() else [f"![timelines]({png_name})", ""]
    )
    path.write_text("\n".join(lines))


def plot(path: Path, runs: dict[str, dict[str, DayResult]]) -> None:
    """Per trace: workers and arrivals over the judged day; the p99 TTFT of the latency window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(15, 3.6 * len(runs)), squeeze=False)
    for (trace, by_policy), (ax_w, ax_t) in zip(runs.items(), axes, strict=True):
        for name, res in by_policy.items():
            tl = np.array(res.timeline)
            if not len(tl):
                continue
            ax_w.step(tl[:, 0] / 3600, tl[:, 1], where="post", label=name, linewidth=1)
            ttft = np.where(tl[:, 4] > 0, tl[:, 4], np.nan)  # nothing finished in the window: no point
            ax_t.plot(tl[:, 0] / 3600, ttft, label=name, linewidth=0.6)
        tl = np.array(next(iter(by_policy.values())).timeline)
        twin = ax_w.twinx()
        twin.plot(tl[:, 0] / 3600, tl[:, 2], color="grey", alpha=0.35, linewidth=0.5)
        twin.set_ylabel("arrivals / s (grey)")
        ax_w.set_ylabel("workers")
        ax_w.set_title(f"{trace}: workers over the judged day")
        ax_w.legend(loc="upper left", fontsize=8)
        ax_t.set_yscale("log")
        ax_t.axhline(TARGETS["ttft_ms"], color="red", linestyle=":", linewidth=0.8)
        ax_t.set_ylabel("p99 TTFT ms (60 s window)")
        ax_t.set_title(f"{trace}: p99 TTFT, target dotted")
        for ax in (ax_w, ax_t):
            ax.set_xlabel("hour of day")
            ax.set_xlim(0, 24)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", default=str(Path(__file__).resolve().parent / "reports" / "autoscaler"))
    ap.add_argument("--notes", default="", help="a Markdown file with the reading of this run")
    args = ap.parse_args()
    out = Path(args.report)
    report = json.loads(out.with_suffix(".json").read_text())
    notes = Path(args.notes).read_text() if args.notes else ""
    write_markdown(out.with_suffix(".md"), report, out.with_suffix(".png").name, notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
