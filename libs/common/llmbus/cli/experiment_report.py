"""What `llmbus experiments show` prints and draws, from llm.experiments and llm.decisions."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from llmbus.contract.messages import Experiment, ExperimentDecision
from llmbus.domain.lifecycle import share_pct


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary(experiments: list[Experiment]) -> Table:
    table = Table("experiment", "state", "control", "candidate", "step", "candidate share", "router sees", "note")
    for e in sorted(experiments, key=lambda e: e.experiment_id):
        steps = e.ramp.steps_pct if e.ramp else []
        router = f"{e.kind}{'' if e.enabled else ' (disabled)'}"
        table.add_row(
            e.experiment_id,
            e.state.value,
            e.control_model or "-",
            e.candidate_model or e.shadow_model or "-",
            f"{e.step}/{len(steps) - 1}" if steps else "-",
            f"{share_pct(e):g} %",
            router,
            e.note[:60],
        )
    return table


def variants_table(decision: ExperimentDecision) -> Table:
    table = Table(
        "variant",
        "model",
        "n",
        "error",
        "completion",
        "p50 ms",
        "p95 ms",
        "p99 ms",
        "$/req",
        "neg fb",
        "similarity",
        title=f"evidence at step {decision.step_from} ({decision.share_from_pct:g} %)",
    )
    for v in decision.variants:
        table.add_row(
            v.variant,
            v.model,
            str(v.samples),
            _fmt(v.error_rate),
            _fmt(v.completion_rate),
            _fmt(v.p50_ms, ".0f"),
            _fmt(v.p95_ms, ".0f"),
            _fmt(v.p99_ms, ".0f"),
            _fmt(v.cost_per_request_usd, ".6f"),
            _fmt(v.negative_feedback_rate),
            _fmt(v.similarity_mean),
        )
    return table


def decisions_table(decision: ExperimentDecision) -> Table:
    table = Table(
        "test (candidate - control)",
        "estimate",
        "95 % conf. sequence",
        "always-valid p",
        title=f"decision: {decision.decision.upper()} — {'; '.join(decision.reasons)}",
    )
    for test in decision.tests:
        table.add_row(
            f"{test.metric} ({test.method})",
            f"{test.estimate:+.4f}",
            f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]",
            f"{test.p_value:.4f}",
        )
    return table


def history_table(decisions: list[ExperimentDecision]) -> Table:
    table = Table("decided at (ms)", "decision", "share", "reasons", title="decisions that moved traffic")
    for d in decisions:
        if d.decision != "hold":
            table.add_row(
                str(d.decided_at_ms), d.decision, f"{d.share_from_pct:g} → {d.share_to_pct:g} %", "; ".join(d.reasons)
            )
    return table


def plot(experiment: Experiment, decisions: list[ExperimentDecision], path: Path) -> None:
    """p95 latency and error rate per variant over time, the error-rate confidence band, ramp steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_lat, ax_err) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    t0 = decisions[0].decided_at_ms if decisions else 0
    series: dict[str, dict[str, list[float]]] = {}
    band: list[tuple[float, float, float]] = []
    for d in decisions:
        x = (d.decided_at_ms - t0) / 1000
        for v in d.variants:
            s = series.setdefault(v.variant, {"x": [], "p95": [], "err": []})
            s["x"].append(x)
            s["p95"].append(v.p95_ms if v.p95_ms is not None else float("nan"))
            s["err"].append(v.error_rate if v.error_rate is not None else float("nan"))
        for test in d.tests:
            if test.metric == "error_rate":
                band.append((x, test.ci_low, test.ci_high))
    for name, s in series.items():
        ax_lat.plot(s["x"], s["p95"], marker=".", label=name)
        ax_err.plot(s["x"], s["err"], marker=".", label=name)
    if band:
        xs, lo, hi = zip(*band, strict=True)
        ax_err.fill_between(xs, [max(v, -1) for v in lo], [min(v, 1) for v in hi], alpha=0.15, label="Δ error 95 % CS")
    for d in decisions:
        if d.decision != "hold":
            x = (d.decided_at_ms - t0) / 1000
            for ax in (ax_lat, ax_err):
                ax.axvline(x, color="red" if d.decision == "rollback" else "green", alpha=0.5, ls="--")
            ax_lat.annotate(
                f"{d.decision} {d.share_to_pct:g}%", (x, ax_lat.get_ylim()[1]), fontsize=7, rotation=90, va="top"
            )
    ax_lat.set_ylabel("p95 total latency (ms)")
    ax_err.set_ylabel("error rate")
    ax_err.set_xlabel("seconds since the first decision")
    ax_lat.legend(fontsize=8)
    ax_err.legend(fontsize=8)
    e = experiment
    fig.suptitle(f"{e.experiment_id}: {e.control_model} → {e.candidate_model} ({e.state.value})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
