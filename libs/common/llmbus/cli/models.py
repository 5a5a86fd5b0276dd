"""`llmbus models …`: the model registry on llm.models (register, push, show, history, release, rollback)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from llmbus.artifacts.push import push_directory
from llmbus.bus.tables import read_table
from llmbus.cli.experiments import (
    Change,
    Record,
    _load,
    _topic,
    operator,
    publish_record,
    write_experiment,
    write_experiments,
)
from llmbus.cli.model_view import history_table, models_table, step_line, version_tree
from llmbus.cli.model_watch import IN_PROGRESS, follow_release
from llmbus.cli.tools import TOOL_COMMAND, run_tool
from llmbus.contract import topics as t
from llmbus.contract.manifest import ModelManifest, load_manifest
from llmbus.contract.messages import Experiment, ExperimentState, ModelSpec, ModelState, now_ms
from llmbus.domain.lifecycle import LifecycleError, with_state
from llmbus.domain.registry import ModelVersions, RegistryError, by_model, parse_ref, registered, transition
from llmbus.domain.release import history, start
from llmbus.settings import BusSettings

models_app = typer.Typer(help="the model registry on llm.models", no_args_is_help=True)
console = Console()
DEMO_MODEL = "llmbus_tools.harness.tiny_llama"  # an offline tool: run as `python -m`, never imported
SET_HELP = "KEY=VALUE over the manifest's value (repeatable; dotted for a section: lineage.parent_version=1)"


def _registry(settings: BusSettings) -> dict[str, ModelVersions]:
    return by_model(asyncio.run(read_table(settings, _topic(settings, t.MODELS), ModelSpec)))


def _model(settings: BusSettings, name: str) -> ModelVersions:
    model = _registry(settings).get(name)
    if model is None:
        _fail(f"no model {name!r} on llm.models")
    return model


def _fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[red]{message}[/red]")
    raise typer.Exit(code)


def _register_version(settings: BusSettings, manifest: ModelManifest, reason: str) -> ModelSpec:
    """Publish the manifest's version as registered; a version already registered is never overwritten."""
    model = _registry(settings).get(manifest.name)
    if model is not None and manifest.version in model.versions:
        _fail(f"{manifest.name}@{manifest.version} is registered already: a version never changes, register a new one")
    try:
        spec = manifest.spec()
    except ValueError as exc:  # an adapter without files, a record the manifest's fields cannot make
        _fail(f"{manifest.name}@{manifest.version}: {exc}")
    record = registered(spec, by=operator(), reason=reason)
    asyncio.run(publish_record(settings, t.MODELS, record.key, record))
    return record


def _load_manifest(path: Path, overrides: list[str]) -> ModelManifest:
    try:
        return load_manifest(path, overrides)
    except (OSError, ValidationError, ValueError) as exc:
        _fail(f"{path}: {exc}")


@models_app.command("register")
def models_register(
    name: str | None = typer.Argument(None, help="a plain model (no manifest): its name"),
    manifest: Path | None = typer.Option(None, "-f", "--file", help="register the version a manifest describes"),
    version: str = typer.Option("1"),
    tier: str | None = typer.Option(None),
    max_model_len: int = typer.Option(8192),
    max_output_tokens: int = typer.Option(4096),
    hosted: bool = typer.Option(False),
    tokenizer: str | None = typer.Option(None, help="local tokenizer reference, e.g. pkg:<package>/<file>"),
    max_num_seqs: int | None = typer.Option(None, help="streams one worker runs at once (workers that set none)"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Register a model version from its manifest (`-f manifest.yaml`), or publish a plain ModelSpec by name."""
    settings = BusSettings()
    if manifest is not None:
        described = _load_manifest(manifest, overrides)
        record = _register_version(settings, described, f"registered from {manifest.name}")
        console.print(
            f"registered {record.key} ({len(record.artifacts)} artifacts){_adapter_of(record)}, state registered"
        )
        return
    if name is None:
        _fail("give a model name, or a manifest with -f")
    spec = ModelSpec(
        name=name,
        version=version,
        tier=tier,
        max_model_len=max_model_len,
        max_output_tokens=max_output_tokens,
        hosted=hosted,
        tokenizer=tokenizer,
        max_num_seqs=max_num_seqs,
    )
    asyncio.run(publish_record(settings, t.MODELS, name, spec))
    console.print(f"registered {name} v{version}")


@models_app.command("push")
def models_push(
    directory: Path = typer.Argument(..., exists=True, file_okay=False, help="the model's files"),
    manifest: Path = typer.Option(..., "--manifest", "-f", help="the version's manifest"),
    to: str = typer.Option(..., help="repository root: file:///dir/ or s3://bucket/prefix/"),
    format: str | None = typer.Option(
        None, "--format", help="the files' format (bf16, fp16, awq, gptq, ...; default bf16, lora for an adapter)"
    ),
    quantization: str | None = typer.Option(None, help="e.g. awq-int4; none for full precision"),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
) -> None:
    """Upload DIR with a sha256 and size per file, then register the version with that artifact.

    An adapter's manifest (its `adapter` section): DIR holds adapter_config.json and its weights, pushed as
    format lora; the registered record's LoRA adapter is served from the uploaded root."""
    settings = BusSettings()
    described = _load_manifest(manifest, overrides)
    format = format or described.default_format
    if described.adapter is not None and not (directory / "adapter_config.json").is_file():
        _fail(f"{directory}: an adapter's directory holds adapter_config.json (peft's save_pretrained writes it)")
    if (known := _registry(settings).get(described.name)) is not None and described.version in known.versions:
        _fail(f"{described.name}@{described.version} is registered already: a version never changes")
    uri = f"{to.rstrip('/')}/{described.name}/{described.version}/{format}/"
    try:
        artifact = push_directory(directory, uri, format=format, quantization=quantization)
    except (OSError, ValueError) as exc:
        _fail(f"push failed: {exc}")
    console.print(f"pushed {len(artifact.files)} files, {artifact.size_bytes} bytes, to {artifact.uri}")
    kept = [a for a in described.artifacts if (a.format, a.quantization) != (format, quantization)]
    with_files = described.model_copy(update={"artifacts": [*kept, artifact]})
    record = _register_version(settings, with_files, f"pushed from {directory} with {manifest.name}")
    console.print(f"registered {record.key}{_adapter_of(record)}, state registered")


def _adapter_of(record: ModelSpec) -> str:
    return f", a LoRA adapter of {record.lora.base_model}" if record.lora is not None else ""


@models_app.command("list")
def models_list() -> None:
    """Every model: the version it serves, its versions and their states."""
    console.print(models_table(_registry(BusSettings())))


@models_app.command("show")
def models_show(ref: str = typer.Argument(..., help="NAME (the serving version) or NAME@VERSION")) -> None:
    """A version with its lineage tree (training data, code commit, hyper-parameters, parents), artifacts and states."""
    try:
        name, version = parse_ref(ref)
    except RegistryError as exc:
        _fail(str(exc))
    model = _model(BusSettings(), name)
    if version is None:
        serving = model.serving.version if model.serving is not None else None
        version = serving or (model.ordered()[-1].version if model.versions else None)
    record = model.versions.get(version or "")
    if record is None:
        _fail(f"no version {version!r} of {name!r} in the registry", code=1)
    console.print(version_tree(record, model))


@models_app.command("history")
def models_history(name: str) -> None:
    """Every release of the model: its versions, the steps walked, the outcome and why."""
    model = _model(BusSettings(), name)
    releases = history(model)
    if not releases:
        console.print(f"{name}: no release yet")
        return
    console.print(history_table(name, releases))


@models_app.command("release")
def models_release(
    ref: str = typer.Argument(..., help="NAME@VERSION, a registered version"),
    salt: str = typer.Option("", help="bucket salt (default: the upgrade id)"),
) -> None:
    """Release a version: shadow, then A/B by user hash, then the ramp, with its manifest's guardrails.

    The shadow-comparator ramps it and rolls it back; the registry follows each step. A model's first
    version has nothing to compare against and serves at once."""
    settings = BusSettings()
    try:
        name, version = parse_ref(ref)
        if version is None:
            raise RegistryError("name the version to release: NAME@VERSION")
        model = _model(settings, name)
        served_by = model.serving.release if model.serving is not None else None
        experiments = asyncio.run(read_table(settings, _topic(settings, t.EXPERIMENTS), Experiment))
        previous = experiments.get(served_by.upgrade_id) if served_by is not None else None
        begun = start(model, version, by=operator(), salt=salt, previous_release=previous)
    except (RegistryError, LifecycleError) as exc:
        _fail(str(exc))
    records: list[Record] = [(t.MODELS, r.key, r) for r in begun.records]
    # Each experiment by compare-and-set, the closed one before the new one on the same topic: the router reads
    # them in order. The new experiment's registry steps are begun.records already.
    changes: list[tuple[Experiment, Change]] = []
    if (closes := begun.closes) is not None and previous is not None:
        closed = {"enabled": False, "note": closes.note, "updated_at_ms": now_ms()}
        changes.append((previous, lambda e: e.model_copy(update=closed)))
    if (experiment := begun.experiment) is not None:
        changes.append((experiment, lambda _unwritten: experiment))
    try:
        asyncio.run(
            write_experiments(
                settings, changes, reason=f"release {begun.upgrade_id}", first=records, follow_registry=False
            )
        )
    except LifecycleError as exc:
        _fail(str(exc))
    stage = "serving (first version)" if begun.experiment is None else "shadow"
    console.print(f"release {begun.upgrade_id}: {ref} is {stage}")


@models_app.command("watch")
def models_watch(
    name: str,
    timeout_s: float = typer.Option(600.0, help="stop following after this long (exit status 2)"),
) -> None:
    """Follow the model's latest release step by step until it ends: exit status 0 promoted, 1 rolled back."""
    console.print(f"{name}: following its latest release")
    try:
        release = asyncio.run(
            follow_release(BusSettings(), name, timeout_s, lambda change: console.print(escape(step_line(change))))
        )
    except RegistryError as exc:
        _fail(str(exc))
    console.print(f"release {release.upgrade_id} of {name}@{release.version}: {release.outcome}")
    if release.outcome == "rolled back":
        raise typer.Exit(1)
    if release.outcome == IN_PROGRESS:
        raise typer.Exit(2)


@models_app.command("demo-model", context_settings=TOOL_COMMAND)
def models_demo_model(ctx: typer.Context) -> None:
    """Write a tiny random-weight Llama to DIR, to push as a version and serve (`llmbus models demo-model --help`)."""
    run_tool(DEMO_MODEL, *ctx.args)


@models_app.command("rollback")
def models_rollback(name: str, reason: str = typer.Option("operator rollback")) -> None:
    """End the model's release in progress: every user back on the serving version, the candidate registered."""
    settings = BusSettings()
    running = _model(settings, name).in_release()
    release = running[0].release if running else None
    if release is None:
        _fail(f"{name}: no release in progress")
    read = _load(settings, release.upgrade_id)
    try:
        stopped = asyncio.run(
            write_experiment(settings, read, lambda e: with_state(e, ExperimentState.STOPPED, note=reason), reason)
        )
    except (LifecycleError, RegistryError) as exc:
        _fail(str(exc))
    console.print(f"rolled back {name}@{running[0].version} ({stopped.experiment_id})")


@models_app.command("retire")
def models_retire(
    ref: str = typer.Argument(..., help="NAME (a plain model) or NAME@VERSION (a registered one)"),
) -> None:
    """A version: registered → retired (it never serves). A plain model: its record is tombstoned."""
    settings = BusSettings()
    try:
        name, version = parse_ref(ref)
        if version is None:
            asyncio.run(publish_record(settings, t.MODELS, name, None))
            console.print(f"retired {name}")
            return
        record = _model(settings, name).versions.get(version)
        if record is None:
            raise RegistryError(f"{ref} is not registered")
        if record.state != ModelState.REGISTERED:
            raise RegistryError(f"{ref} is {record.state}: release another version to retire a serving one")
        retired = transition(record, ModelState.RETIRED, by=operator(), reason="operator retire")
    except RegistryError as exc:
        _fail(str(exc))
    asyncio.run(publish_record(settings, t.MODELS, retired.key, retired))
    console.print(f"retired {ref}")
