"""`llmbus models …` and `llmbus experiments …` against the real broker: the records they write and read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmbus.bus.tables import read_table
from llmbus.cli.experiments import publish_record
from llmbus.cli.main import app
from llmbus.contract import topics as t
from llmbus.contract.messages import (
    Experiment,
    ExperimentDecision,
    ExperimentState,
    ModelSpec,
    StatEvidence,
    VariantEvidence,
)
from llmbus.settings import BusSettings

pytestmark = [pytest.mark.kafka, pytest.mark.redis]


def run(settings: BusSettings, *args: str) -> str:
    env = {"LLMBUS_TOPIC_PREFIX": settings.topic_prefix, "COLUMNS": "200"}
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def table(settings: BusSettings, base: str, model: type) -> dict:  # type: ignore[type-arg]
    return asyncio.run(read_table(settings, t.Topics(settings.topic_prefix).name(base), model))


def test_models_register_list_retire(bus_settings: BusSettings) -> None:
    run(bus_settings, "models", "register", "m-v2", "--version", "2", "--max-output-tokens", "512")
    assert table(bus_settings, t.MODELS, ModelSpec)["m-v2"].version == "2"
    assert "m-v2" in run(bus_settings, "models", "list")
    run(bus_settings, "models", "retire", "m-v2")
    assert "m-v2" not in table(bus_settings, t.MODELS, ModelSpec)


def test_experiments_create_ramp_pause_stop_show(bus_settings: BusSettings, tmp_path: Path) -> None:
    s = bus_settings
    run(s, "experiments", "create", "e1", "--control", "m1", "--candidate", "m2", "--shadow-share", "0.3")
    e = table(s, t.EXPERIMENTS, Experiment)["e1"]
    assert (e.kind, e.shadow_model, e.shadow_share, e.match_models) == ("shadow", "m2", 0.3, ["m1"])
    run(s, "experiments", "ramp", "e1", "--to", "25")
    e = table(s, t.EXPERIMENTS, Experiment)["e1"]
    assert e.kind == "ab" and [v.weight for v in e.variants] == [75.0, 25.0]
    run(s, "experiments", "pause", "e1")
    assert table(s, t.EXPERIMENTS, Experiment)["e1"].state == ExperimentState.PAUSED
    # A decision as the comparator would write it, so `show` has evidence to print and draw.
    decision = ExperimentDecision(
        experiment_id="e1",
        decision="hold",
        reasons=["guardrails hold", "state paused"],
        step_from=3,
        step_to=3,
        share_from_pct=25,
        share_to_pct=25,
        state=ExperimentState.PAUSED,
        variants=[
            VariantEvidence(variant="control", model="m1", samples=500, error_rate=0.01, p95_ms=900),
            VariantEvidence(variant="candidate", model="m2", samples=160, error_rate=0.0125, p95_ms=700),
        ],
        tests=[StatEvidence(metric="error_rate", estimate=0.0025, ci_low=-0.02, ci_high=0.025, p_value=1.0)],
    )
    asyncio.run(publish_record(s, t.DECISIONS, "e1", decision))
    png = tmp_path / "e1.png"
    out = run(s, "experiments", "show", "e1", "--png", str(png))
    assert "paused" in out and "candidate" in out and "HOLD" in out and "error_rate" in out
    assert png.stat().st_size > 10_000
    run(s, "experiments", "stop", "e1")
    stopped = table(s, t.EXPERIMENTS, Experiment)["e1"]
    assert stopped.state == ExperimentState.STOPPED and not stopped.enabled
    bad = CliRunner().invoke(
        app, ["experiments", "ramp", "e1", "--to", "50"], env={"LLMBUS_TOPIC_PREFIX": s.topic_prefix}
    )
    assert bad.exit_code == 2 and "ended" in bad.output
    assert "e1" in run(s, "experiments", "show")
