"""Autoscaling on three traffic shapes: the smallest static fleet vs threshold vs predictive, out of sample.

    python -m bench.autoscaler_bench [--traces conversation,code,reasoning] [--processes 2]
        [--tune-shares 0.005,0.02,0.05] [--cold-start-s 120] [--profile llama-3.3-70b-h100-tp4]

Per trace (bench/autoscaler_traces.py: a conversation, a prefill-heavy and a decode-heavy shape,
each about an hour of public data warped onto a tidal day), in virtual time through the real
SchedulerCore and the real policies on engines modelled step for step (bench/autoscaler_replay.py):
1. tuning day (the trace's first half): the predictive policy at each `--tune-shares` burst_late_share
   (the share of requests its burst sizing may leave late); the largest that meets the SLO there is
   the one judged — the fewest workers that held the target (its other parameters are the same on
   every trace: PREDICTIVE_PARAMS);
2. judged day (the second half, never seen while tuning): the smallest static fleet that meets the
   SLO (searched: a fleet that misses is given up on once more requests are late than the SLO
   allows), the threshold policy with the design source's numbers, and the predictive policy.
Targets, every trace: >= 99 % of requests with TTFT <= 2 s; <= 0.7x the static fleet's GPU-hours;
cold-start GPU-hours <= 5 % of the total; no flapping. Writes bench/reports/autoscaler.{json,md,png}.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import multiprocessing
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.autoscaler_replay import Arrival, DayResult, ReplayConfig, replay_day
from bench.autoscaler_report import TARGETS, plot, write_markdown
from bench.autoscaler_traces import DAY_SHAPE, TRACES, TraceSpec, days
from llmbus_services.autoscaler.core import Bounds
from llmbus_services.autoscaler.core.policies import (
    PredictiveParams,
    PredictivePolicy,
    ThresholdParams,
    ThresholdPolicy,
)
from llmbus_services.autoscaler.core.sizing import EngineModel, Headroom, TokenLoad, workers_for
from llmbus_services.autoscaler.core.workload import BurstTracker
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile, get_profile

REPORTS = Path(__file__).resolve().parent / "reports"
# The predictive policy's settings besides burst_late_share: the same on every trace, not tuned on any.
PREDICTIVE_PARAMS: dict[str, float] = {
    "ttft_target_ms": 2000,
    "target_queue_wait_ms": 300,
    "max_utilisation": 0.7,
    "down_utilisation": 0.5,
    "slot_utilisation": 0.9,
    "lead_s": 30,
    "present_after_s": 30,
    "down_after_s": 120,
    "down_hold_cold_starts": 5,
    "latency_up_after_s": 60,
    "wait_up_after_s": 30,
    "idle_after_s": 600,
}


@dataclass(frozen=True)
class Job:
    trace: str
    name: str
    kind: str  # static | threshold | predictive
    day: str  # tune | judge
    replicas: int = 0  # static
    share: float = 0.0  # predictive: burst_late_share


# trace → "tune" | "judge" → (the day, the day before it); set before forking
DAYS: dict[str, dict[str, tuple[list[Arrival], list[Arrival]]]] = {}


def engine_model(profile: SimProfile) -> EngineModel:
    """The policy's engine model: the calibrated step time of the workers it scales."""
    return EngineModel(
        step_base_us=profile.step_base_us,
        prefill_us_per_token=profile.prefill_us_per_token,
        decode_us_per_seq=profile.decode_us_per_seq,
    )


def build_policy(job: Job, args: argparse.Namespace, history: list[Arrival]) -> ThresholdPolicy | PredictivePolicy:
    bounds = Bounds(1, args.max_replicas)
    if job.kind == "threshold":
        return ThresholdPolicy(bounds, ThresholdParams())  # the design source's numbers, its latency trigger at 2 s
    params = PredictiveParams.model_validate(
        PREDICTIVE_PARAMS
        | {
            "engine": engine_model(get_profile(args.profile)),
            "burst_late_share": job.share,
            "default_cold_start_s": args.cold_start_s,
        }
    )
    policy = PredictivePolicy(bounds, params)
    counts = np.bincount((np.array([a.at_ms for a in history]) // 5000).astype(int), minlength=17280)
    for i, c in enumerate(counts[:17280]):
        policy.observe_history(i * 5.0 - 86_400, int(c), 5.0)  # the day before this one
    return policy


def run_one(job_and_args: tuple[Job, argparse.Namespace]) -> tuple[Job, DayResult, float]:
    job, args = job_and_args
    day, history = DAYS[job.trace][job.day]
    started = time.perf_counter()
    cfg = ReplayConfig(slots=args.slots, cold_start_s=args.cold_start_s)
    policy = None if job.kind == "static" else build_policy(job, args, history)
    give_up = int(len(day) * (1 - TARGETS["attainment"])) if job.kind == "static" else None
    res = replay_day(
        day, get_profile(args.profile), cfg, policy, static_replicas=job.replicas, give_up_after_late=give_up
    )
    wall_s = time.perf_counter() - started
    print(f"   {job.trace}/{job.name} on the {job.day} day: {wall_s:.0f} s", flush=True)
    return job, res, wall_s


def run_jobs(jobs: list[Job], args: argparse.Namespace) -> list[tuple[Job, DayResult, float]]:
    print(f"== {', '.join(f'{j.trace}/{j.name}' for j in jobs)}", flush=True)
    with multiprocessing.get_context("fork").Pool(min(len(jobs), args.processes)) as pool:
        return pool.map(run_one, [(j, args) for j in jobs], chunksize=1)


def flaps(decisions: list[dict], within_s: float) -> int:
    """Direction reversals within `within_s`: a scale-down undone by a scale-up soon after, or the reverse."""
    count = 0
    for a, b in itertools.pairwise(decisions):
        up_a, up_b = a["to"] > a["from"], b["to"] > b["from"]
        count += int(up_a != up_b and b["t_s"] - a["t_s"] <= within_s)
    return count


def rule_of(reason: str) -> str:
    for key, rule in (
        ("TTFT", "latency +1"),
        ("queue wait", "queue-wait +1"),
        ("at zero", "wake from zero"),
        ("to zero", "idle to zero"),
        ("work present", "work present up"),
        ("scale down", "scale down"),
        ("no traffic", "idle down"),
        ("below the pool minimum", "to the minimum"),
    ):
        if key in reason:
            return rule
    return "forecast up"


def summarise(name: str, res: DayResult, requests: int, wall_s: float, cold_start_s: float) -> dict:
    ttft = np.array(res.ttft_ms) if res.ttft_ms else np.array([np.inf])
    met = int(np.sum(ttft <= TARGETS["ttft_ms"]))
    return {
        "policy": name,
        "requests": requests,
        "slo_attainment": met / requests,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "unserved": res.unserved,
        "gave_up_at_h": round(res.gave_up_at_s / 3600, 2) if res.gave_up_at_s is not None else None,
        "gpu_hours": round(res.gpu_hours, 1),
        "cold_start_gpu_hours": round(res.cold_start_gpu_hours, 2),
        "scale_events": res.scale_events,
        "scale_events_per_hour": round(res.scale_events / 24, 2),
        "flaps": flaps(res.decisions, 2 * cold_start_s),
        "workers_started": res.workers_started,
        "workers_never_served": res.never_served_workers,
        "scale_events_by_rule": dict(Counter(rule_of(d["reason"]) for d in res.decisions)),
        "replay_wall_s": round(wall_s, 1),
    }


@dataclass
class StaticSearch:
    """The smallest static fleet meeting the SLO: from a first guess, up by half until one meets, then
    halving the gap to the largest that missed."""

    first: int
    failing: int = 0  # the largest fleet known to miss
    meeting: int | None = None  # the smallest fleet known to meet

    def next(self) -> int | None:
        if self.meeting is None:
            return max(self.first, math.ceil(1.5 * self.failing))
        if self.meeting - self.failing <= 1:
            return None
        return (self.failing + self.meeting) // 2

    def record(self, replicas: int, met: bool) -> None:
        if met:
            self.meeting = replicas if self.meeting is None else min(self.meeting, replicas)
        else:
            self.failing = max(self.failing, replicas)


def first_static_guess(spec: TraceSpec, profile: SimProfile, day: list[Arrival], slots: int) -> int:
    """Where the search starts: the predictive policy's own sizing of the day's peak (its rate, mean tokens
    and the burstiness of its 5 s windows up to the end of the first peak)."""
    bursts = BurstTracker()
    at_s = np.array([a.at_ms / 1000 for a in day])
    prompts = np.array([a.prompt_tokens for a in day])
    windows = (at_s // 5).astype(int)
    tokens = np.bincount(windows, weights=prompts, minlength=17280)
    counts = np.bincount(windows, minlength=17280)
    for i in range(12 * 720):
        bursts.observe(i * 5.0 + 5, 5.0, int(counts[i]), int(tokens[i]))
    peak_rate = spec.base_rate_per_s * max(s for _, s in DAY_SHAPE)
    prompt = float(np.mean(prompts))
    output = float(np.mean([a.output_tokens for a in day]))
    load = TokenLoad(peak_rate, prompt, output, bursts.profile())
    headroom = Headroom(0.7, 0.9, TARGETS["ttft_ms"] / 1000, burst_late_share=0.005)
    return workers_for(load, engine_model(profile), slots, headroom, 40)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=",".join(TRACES), help=f"of {', '.join(TRACES)}")
    ap.add_argument("--profile", default="llama-3.3-70b-h100-tp4", help="the workers' sim profile")
    ap.add_argument("--slots", type=int, default=256, help="max_num_seqs of a worker")
    ap.add_argument("--cold-start-s", type=float, default=120.0)
    ap.add_argument("--max-replicas", type=int, default=40)
    ap.add_argument(
        "--tune-shares", default="0.005,0.02,0.05", help="predictive burst_late_share values tried on each tuning day"
    )
    ap.add_argument("--processes", type=int, default=2, help="replays run side by side")
    ap.add_argument("--out", default=str(REPORTS / "autoscaler"))
    ap.add_argument("--notes", default="", help="a Markdown file with the reading of the run, put in the report")
    args = ap.parse_args()
    command = "python -m bench.autoscaler_bench " + " ".join(sys.argv[1:])
    started = time.perf_counter()
    profile = get_profile(args.profile)
    specs = [TRACES[name] for name in args.traces.split(",")]
    shares = sorted(float(c) for c in args.tune_shares.split(","))
    for spec in specs:
        DAYS[spec.name] = days(spec)
        print(f"{spec.name}: judged day {len(DAYS[spec.name]['judge'][0])} requests, tuning day "
              f"{len(DAYS[spec.name]['tune'][0])}", flush=True)  # fmt: skip
    searches = {
        s.name: StaticSearch(first_static_guess(s, profile, DAYS[s.name]["judge"][0], args.slots)) for s in specs
    }
    done: list[tuple[Job, DayResult, float]] = []
    jobs = [Job(s.name, f"tune-predictive-{c:g}", "predictive", "tune", share=c) for s in specs for c in shares]
    jobs += [Job(s.name, "threshold", "threshold", "judge") for s in specs]
    chosen: dict[str, float] = {}
    while True:
        jobs += [Job(n, f"static-{r}", "static", "judge", replicas=r) for n, s in searches.items() if (r := s.next())]
        if not jobs:
            break
        for job, res, wall_s in run_jobs(jobs, args):
            done.append((job, res, wall_s))
            if job.kind == "static":
                met = (
                    res.gave_up_at_s is None
                    and summarise("", res, len(DAYS[job.trace]["judge"][0]), 0, 0)["slo_attainment"]
                    >= TARGETS["attainment"]
                )
                searches[job.trace].record(job.replicas, met)
        jobs = []
        for spec in specs:
            if spec.name in chosen:
                continue
            tuned = {
                j.share: summarise(j.name, r, len(DAYS[spec.name]["tune"][0]), w, args.cold_start_s)
                for j, r, w in done
                if j.trace == spec.name and j.day == "tune"
            }
            meeting = [c for c in shares if tuned[c]["slo_attainment"] >= TARGETS["attainment"]]
            chosen[spec.name] = max(meeting) if meeting else min(shares)
            jobs.append(Job(spec.name, "predictive", "predictive", "judge", share=chosen[spec.name]))
    report = {
        "command": command,
        "settings": {k: v for k, v in vars(args).items() if k != "out"}  # no machine paths in a report
        | {"predictive_params": PREDICTIVE_PARAMS, "day_shape": DAY_SHAPE},
        "targets": TARGETS,
        "traces": [trace_report(spec, done, searches[spec.name], chosen[spec.name], args) for spec in specs],
        "bench_wall_s": round(time.perf_counter() - started),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    notes = Path(args.notes).read_text() if args.notes else ""
    write_markdown(out.with_suffix(".md"), report, out.with_suffix(".png").name, notes)
    timelines = {
        spec.name: {
            row: next(r for j, r, _ in done if j.trace == spec.name and j.day == "judge" and j.name == name)
            for row, name in (
                (f"static ({searches[spec.name].meeting})", f"static-{searches[spec.name].meeting}"),
                ("threshold", "threshold"),
                ("predictive", "predictive"),
            )
        }
        for spec in specs
    }
    plot(out.with_suffix(".png"), timelines)
    print(f"wrote {out}.{{json,md,png}} in {report['bench_wall_s']} s")
    return 0


def trace_report(
    spec: TraceSpec,
    done: list[tuple[Job, DayResult, float]],
    search: StaticSearch,
    share: float,
    args: argparse.Namespace,
) -> dict:
    judge, tune = (len(DAYS[spec.name][d][0]) for d in ("judge", "tune"))
    mine = [(j, r, w) for j, r, w in done if j.trace == spec.name]
    statics = [
        summarise(j.name, r, judge, w, args.cold_start_s) | {"replicas": j.replicas}
        for j, r, w in sorted(mine, key=lambda m: m[0].replicas)
        if j.kind == "static"
    ]
    rows = {j.name: summarise(j.name, r, judge, w, args.cold_start_s) for j, r, w in mine if j.day == "judge"}
    static = rows[f"static-{search.meeting}"] if search.meeting is not None else statics[-1]
    for row in rows.values():
        row["gpu_hours_vs_static"] = round(row["gpu_hours"] / static["gpu_hours"], 3)
        row["cold_start_share"] = round(row["cold_start_gpu_hours"] / max(row["gpu_hours"], 1e-9), 4)
    predictive = rows["predictive"]
    verdict = {
        "attainment": predictive["slo_attainment"] >= TARGETS["attainment"],
        "gpu_ratio": predictive["gpu_hours_vs_static"] <= TARGETS["gpu_ratio"],
        "cold_start_share": predictive["cold_start_share"] <= TARGETS["cold_start_share"],
        "no_flapping": predictive["flaps"] == 0,
    }
    decisions = next(r.decisions for j, r, _ in mine if j.day == "judge" and j.name == "predictive")
    return {
        "trace": spec.name,
        "file": spec.file,
        "shape": spec.shape,
        "base_rate_per_s": spec.base_rate_per_s,
        "requests": {"judged_day": judge, "tuning_day": tune},
        "static_replicas": search.meeting,
        "static_candidates": statics,
        "results": [static | {"policy": f"static ({search.meeting} workers)"}, rows["threshold"], predictive],
        "tuning_day": [
            summarise(j.name, r, tune, w, args.cold_start_s) | {"share": j.share} for j, r, w in mine if j.day == "tune"
        ],
        "share_chosen": share,
        "targets_met": verdict,
        "predictive_decisions": decisions[:300],
    }


if __name__ == "__main__":
    sys.exit(main())
