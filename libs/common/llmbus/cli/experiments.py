"""`llmbus models …` and `llmbus experiments …`: the operator's writers of llm.models and llm.experiments."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from llmbus.bus import Publisher, make_producer
from llmbus.bus.producer import stop_producer
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
from llmbus.domain.lifecycle import LifecycleError, create, share_pct, step_for_share, to_step, with_state
from llmbus.settings import BusSettings

models_app = typer.Typer(help="the model registry on llm.models", no_args_is_help=True)
experiments_app = typer.Typer(help="shadow → A/B → ramp experiments on llm.experiments", no_args_is_help=True)
console = Console()


def _topic(settings: BusSettings, base: str) -> str:
    return t.Topics(settings.topic_prefix).name(base)


async def publish_record(settings: BusSettings, base: str, key: str, value: Message | None) -> None:
    """One record (a message, or a tombstone when `value` is None), acknowledged by the broker."""
    producer = make_producer(settings, client_id="llmbus-cli")
    await asyncio.wait_for(producer.start(), settings.admin_timeout_s)
    try:
        if value is None:
            delivery = await asyncio.wait_for(
                producer.send(_topic(settings, base), None, key=key.encode()), settings.send_timeout_s
            )
            await asyncio.wait_for(delivery, settings.send_timeout_s)
        else:
            await Publisher(producer, t.CLIENT, settings.send_timeout_s).publish(_topic(settings, base), value, key=key)
    finally:
        await stop_producer(producer, settings.stop_timeout_s)


# --- models --------------------------------------------------------------------------------


@models_app.command("register")
def models_register(
    name: str,
    version: str = typer.Option("1"),
    tier: str | None = typer.Option(None),
    max_model_len: int = typer.Option(8192),
    max_output_tokens: int = typer.Option(4096),
    hosted: bool = typer.Option(False),
    tokenizer: str | None = typer.Option(None, help="local tokenizer reference, e.g. pkg:<package>/<file>"),
) -> None:
    """Publish a ModelSpec (the router and scheduler pick it up from the compacted topic)."""
    spec = ModelSpec(
        name=name,
        version=version,
        tier=tier,
        max_model_len=max_model_len,
        max_output_tokens=max_output_tokens,
        hosted=hosted,
        tokenizer=tokenizer,
    )
    asyncio.run(publish_record(BusSettings(), t.MODELS, name, spec))
    console.print(f"registered {name} v{version}")


@models_app.command("list")
def models_list() -> None:
    """The models as llm.models describes them now."""
    settings = BusSettings()
    table = Table("model", "version", "tier", "max len", "max output", "hosted")
    for spec in sorted(asyncio.run(read_table(settings, _topic(settings, t.MODELS), ModelSpec)).values(), key=str):
        table.add_row(
            spec.name,
            spec.version,
            spec.tier or "",
            str(spec.max_model_len),
            str(spec.max_output_tokens),
            str(spec.hosted),
        )
    console.print(table)


@models_app.command("retire")
def models_retire(name: str) -> None:
    """Tombstone the model's record: the router stops choosing it."""
    asyncio.run(publish_record(BusSettings(), t.MODELS, name, None))
    console.print(f"retired {name}")


# --- experiments ---------------------------------------------------------------------------


def _load(settings: BusSettings, experiment_id: str) -> Experiment:
    experiments = asyncio.run(read_table(settings, _topic(settings, t.EXPERIMENTS), Experiment))
    if experiment_id not in experiments:
        console.print(f"[red]no experiment {experiment_id!r}[/red]")
        raise typer.Exit(1)
    return experiments[experiment_id]


def _write(settings: BusSettings, experiment: Experiment, verb: str) -> None:
    asyncio.run(publish_record(settings, t.EXPERIMENTS, experiment.experiment_id, experiment))
    console.print(
        f"{verb} {experiment.experiment_id}: {experiment.state.value}, step {experiment.step}, "
        f"candidate {experiment.candidate_model} at {share_pct(experiment)} %"
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
    _write(BusSettings(), experiment, "created")


@experiments_app.command("ramp")
def experiments_ramp(
    experiment_id: str, to: float = typer.Option(..., help="candidate share (percent), a plan step")
) -> None:
    """Move the candidate to a step of the plan by hand (0 goes back to shadow)."""
    settings = BusSettings()
    experiment = _load(settings, experiment_id)
    try:
        updated = to_step(experiment, step_for_share(experiment, to), note=f"operator ramp to {to} %")
    except LifecycleError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _write(settings, updated, "ramped")


def _set_state(experiment_id: str, state: ExperimentState, verb: str) -> None:
    settings = BusSettings()
    try:
        updated = with_state(_load(settings, experiment_id), state, note=f"operator {verb}")
    except LifecycleError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _write(settings, updated, verb)


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
