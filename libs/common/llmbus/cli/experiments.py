"""`llmbus experiments …`: the operator's writer of llm.experiments (and the records both CLIs publish with).

A step of a release (an experiment between two versions of one model) is followed in the registry:
the version records of llm.models are written before the experiment (llmbus.domain.release.follow).
"""

from __future__ import annotations

import asyncio
import getpass
from collections.abc import Callable, Sequence
from pathlib import Path

import typer
from rich.console import Console

from llmbus.bus import Bus
from llmbus.bus.tables import read_log, read_table
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Experiment,
    ExperimentDecision,
    ExperimentState,
    Guardrails,
    Message,
    ModelSpec,
    RampPlan,
)
from llmbus.domain.lifecycle import (
    LifecycleError,
    create,
    newest,
    next_version,
    share_pct,
    step_for_share,
    to_step,
    with_state,
)
from llmbus.domain.registry import ModelVersions, RegistryError, by_model
from llmbus.domain.release import follow
from llmbus.settings import BusSettings
from llmbus.state.experiment_versions import ExperimentVersions
from llmbus.state.store import redis_client

WRITE_ATTEMPTS = 5  # a change refused because another came first is made again on it, this many times

Record = tuple[str, str, Message | None]  # (topic, key, message or None for a tombstone)
Change = Callable[[Experiment], Experiment]

experiments_app = typer.Typer(help="shadow → A/B → ramp experiments on llm.experiments", no_args_is_help=True)
console = Console()


def _topic(settings: BusSettings, base: str) -> str:
    return t.Topics(settings.topic_prefix).name(base)


async def publish_record(settings: BusSettings, base: str, key: str, value: Message | None) -> None:
    """One record (a message, or a tombstone when `value` is None), acknowledged by the broker."""
    await publish_records(settings, [(base, key, value)])


async def publish_records(settings: BusSettings, records: Sequence[Record]) -> None:
    """(topic, key, message or None for a tombstone), each acknowledged before the next is sent: in order."""
    bus = await Bus.start(settings, t.CLIENT)
    try:
        for base, key, value in records:
            await bus.publisher.publish(_topic(settings, base), value, key=key)
    finally:
        await bus.stop()


def operator() -> str:
    """Who the registry records as having made an operator's change."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "operator"


# --- experiments ---------------------------------------------------------------------------


def _read(settings: BusSettings, experiment_id: str) -> Experiment | None:
    return asyncio.run(read_table(settings, _topic(settings, t.EXPERIMENTS), Experiment)).get(experiment_id)


def _load(settings: BusSettings, experiment_id: str) -> Experiment:
    experiment = _read(settings, experiment_id)
    if experiment is None:
        console.print(f"[red]no experiment {experiment_id!r}[/red]")
        raise typer.Exit(1)
    return experiment


async def _release_model(settings: BusSettings, experiment: Experiment) -> ModelVersions | None:
    """The registry's records of a release's model (None for an experiment between two models)."""
    if not experiment.is_release or experiment.candidate_model is None:
        return None
    records = await read_table(settings, _topic(settings, t.MODELS), ModelSpec)
    model = by_model(records).get(experiment.candidate_model)
    if model is None:
        raise RegistryError(f"model {experiment.candidate_model!r} is not in the registry")
    return model


async def _claim(
    versions: ExperimentVersions, read: Experiment, change: Change, model: ModelVersions | None, reason: str
) -> tuple[Experiment, list[Record]]:
    """`change` made on the newest version of the experiment and written as the next version by compare-and-set;
    a change that came in between is taken and `change` made again on it. The version written and the records
    to publish, in order: the llm.models records that follow a release's new step (`model` given), the experiment."""
    base = newest(read, await versions.latest(read.experiment_id))
    for _ in range(WRITE_ATTEMPTS):
        updated = next_version(base, change(base))
        steps = follow(updated, model, by=operator(), reason=updated.note or reason) if model is not None else []
        written, current = await versions.compare_and_set(base.version, updated)
        if written:
            return updated, [*((t.MODELS, r.key, r) for r in steps), (t.EXPERIMENTS, updated.experiment_id, updated)]
        base = newest(base, current)
    raise LifecycleError(f"experiment {read.experiment_id!r} kept changing: try again")


async def write_experiments(
    settings: BusSettings,
    changes: Sequence[tuple[Experiment, Change]],
    *,
    reason: str,
    first: Sequence[Record] = (),
    follow_registry: bool = True,
) -> list[Experiment]:
    """Each (read, change) made on the newest version of its experiment and published as the next version.

    `read` is what the caller read (llm.experiments); a newer version already written (the
    comparator's ramp since) is taken instead. Each change is written by compare-and-set
    (llmbus.state.experiment_versions), so an operator's command is never lost to, nor undone by, a
    decision made on an older read. Published in order: `first`, then for each change the registry
    records that follow a release's step (`follow_registry`) and the experiment.
    """
    client = redis_client(settings.redis_url, password=settings.redis_password, cluster=settings.redis_cluster)
    versions = ExperimentVersions(client, settings.topic_prefix)
    records, written = list(first), []
    try:
        for read, change in changes:
            model = await _release_model(settings, read) if follow_registry else None
            updated, claimed = await _claim(versions, read, change, model, reason)
            written.append(updated)
            records += claimed
    finally:
        await client.aclose()
    await publish_records(settings, records)
    return written


async def write_experiment(settings: BusSettings, read: Experiment, change: Change, reason: str = "") -> Experiment:
    """One change of one experiment (write_experiments), a release's registry steps with it."""
    (written,) = await write_experiments(settings, [(read, change)], reason=reason or "operator change")
    return written


def _write(settings: BusSettings, read: Experiment, change: Change, verb: str) -> None:
    try:
        experiment = asyncio.run(write_experiment(settings, read, change, reason=f"operator {verb}"))
    except (LifecycleError, RegistryError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    console.print(
        f"{verb} {experiment.experiment_id}: {experiment.state.value}, step {experiment.step}, "
        f"candidate {experiment.candidate_model} at {share_pct(experiment)} %, version {experiment.version}"
    )


@experiments_app.command("create")
def experiments_create(
    experiment_id: str,
    control: str = typer.Option(..., help="the model users get now"),
    candidate: str = typer.Option(..., help="the new model version"),
    shadow_share: float = typer.Option(1.0, min=0.0, max=1.0, help="share of control's users mirrored in shadow"),
    salt: str = typer.Option("", help="bucket salt (default: the experiment id)"),
    steps: str = typer.Option("0,1,5,25,50,100", help="candidate shares (percent) of the ramp; 0 = shadow"),
    min_samples_per_step: int = typer.Option(200),
    min_step_s: float = typer.Option(60.0),
    manual: bool = typer.Option(False, help="never ramp by itself (guardrails still roll back)"),
    max_error_rate: float = typer.Option(0.05),
    max_p95_regression: float = typer.Option(0.25, help="0.25 = candidate p95 up to +25 %"),
    max_negative_feedback_rate: float = typer.Option(0.3),
    min_similarity: float = typer.Option(0.5, help="shadow: mean ROUGE-L F1 to control's answers"),
    min_samples: int = typer.Option(30, help="per variant before a guardrail can trip on its estimate"),
) -> None:
    """Start an experiment in shadow: users keep control's answers, the candidate is compared offline."""
    try:
        ramp = RampPlan(
            steps_pct=[float(s) for s in steps.split(",")],
            min_samples_per_step=min_samples_per_step,
            min_step_s=min_step_s,
            auto=not manual,
        )
        guardrails = Guardrails(
            max_error_rate=max_error_rate,
            max_p95_regression=max_p95_regression,
            max_negative_feedback_rate=max_negative_feedback_rate,
            min_similarity=min_similarity,
            min_samples=min_samples,
        )
        experiment = create(
            experiment_id, control, candidate, shadow_share=shadow_share, salt=salt, ramp=ramp, guardrails=guardrails
        )
    except (LifecycleError, ValueError) as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    settings = BusSettings()
    # An experiment of that id already: replaced, by a version above it.
    _write(settings, _read(settings, experiment_id) or experiment, lambda _older: experiment, "created")


@experiments_app.command("ramp")
def experiments_ramp(
    experiment_id: str, to: float = typer.Option(..., help="candidate share (percent), a plan step")
) -> None:
    """Move the candidate to a step of the plan by hand (0 goes back to shadow)."""
    settings = BusSettings()
    _write(
        settings,
        _load(settings, experiment_id),
        lambda e: to_step(e, step_for_share(e, to), note=f"operator ramp to {to} %"),
        "ramped",
    )


def _set_state(experiment_id: str, state: ExperimentState, verb: str) -> None:
    settings = BusSettings()
    _write(settings, _load(settings, experiment_id), lambda e: with_state(e, state, note=f"operator {verb}"), verb)


@experiments_app.command("pause")
def experiments_pause(experiment_id: str) -> None:
    """Freeze the split: no more ramping (a broken guardrail still rolls back)."""
    _set_state(experiment_id, ExperimentState.PAUSED, "paused")


@experiments_app.command("resume")
def experiments_resume(experiment_id: str) -> None:
    """Let the decision loop ramp again."""
    _set_state(experiment_id, ExperimentState.RUNNING, "resumed")


@experiments_app.command("stop")
def experiments_stop(experiment_id: str) -> None:
    """End it: every user back on control."""
    _set_state(experiment_id, ExperimentState.STOPPED, "stopped")


@experiments_app.command("show")
def experiments_show(
    experiment_id: str | None = typer.Argument(None, help="one experiment (default: list them all)"),
    png: Path | None = typer.Option(None, help="write the metric-over-time chart here"),
) -> None:
    """The experiment, its variants' evidence at the last decision, the decision, and its history."""
    from llmbus.cli.experiment_report import decisions_table, history_table, plot, summary, variants_table

    settings = BusSettings()
    experiments = asyncio.run(read_table(settings, _topic(settings, t.EXPERIMENTS), Experiment))
    if experiment_id is None:
        console.print(summary(list(experiments.values())))
        return
    if experiment_id not in experiments:
        console.print(f"[red]no experiment {experiment_id!r}[/red]")
        raise typer.Exit(1)
    decisions = [
        d
        for key, d in asyncio.run(read_log(settings, _topic(settings, t.DECISIONS), ExperimentDecision))
        if key == experiment_id
    ]
    console.print(summary([experiments[experiment_id]]))
    if decisions:
        console.print(variants_table(decisions[-1]))
        console.print(decisions_table(decisions[-1]))
        console.print(history_table(decisions))
    else:
        console.print("no decision yet (the comparator decides every LLMBUS_COMPARATOR_DECIDE_INTERVAL_S)")
    if png is not None:
        plot(experiments[experiment_id], decisions, png)
        console.print(f"chart: {png}")
