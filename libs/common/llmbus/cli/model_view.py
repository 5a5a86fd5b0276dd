"""How `llmbus models` prints the registry: the models table, a version's lineage tree, the release history."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from llmbus.contract.messages import ModelSpec, StateTransition
from llmbus.domain.registry import ModelVersions
from llmbus.domain.release import ReleaseSummary

# How far `show` follows parents: a loop in hand-written lineage must not hang the command.
MAX_ANCESTORS = 32


def _when(at_ms: int | None) -> str:
    if at_ms is None:
        return "-"
    return datetime.fromtimestamp(at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _size(n_bytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n_bytes < 1024 or unit == "GiB":
            return f"{n_bytes:.0f} {unit}" if unit == "B" else f"{n_bytes:.1f} {unit}"
        n_bytes /= 1024  # type: ignore[assignment]
    return f"{n_bytes} B"


def state_label(record: ModelSpec) -> str:
    state = record.state.value if record.state else "unmanaged"
    if record.release is not None and record.state is not None and record.state.value == "canary":
        return f"{state} {record.release.share_pct:g}%"
    return state


def models_table(models: dict[str, ModelVersions]) -> Table:
    table = Table("model", "serving", "versions (state)", "tier", "max len", "hosted", "owner")
    for name in sorted(models):
        model = models[name]
        serving = model.serving
        versions = ", ".join(f"{v.version} ({state_label(v)})" for v in model.ordered()) or "-"
        table.add_row(
            name,
            serving.version if serving is not None else "-",
            versions,
            (serving.tier if serving is not None else None) or "",
            str(serving.max_model_len) if serving is not None else "",
            str(serving.hosted) if serving is not None else "",
            (serving.owner if serving is not None else None) or "",
        )
    return table


def step_line(change: StateTransition) -> str:
    step = change.release.label() if change.release is not None else ""
    moved = f"{change.from_state.value} → " if change.from_state is not None else ""
    release = f" ({change.release.upgrade_id} {step})" if change.release is not None else ""
    return f"{_when(change.at_ms)} {moved}{change.to_state.value}{release} by {change.by}: {change.reason or '-'}"


def _lineage(branch: Tree, record: ModelSpec, model: ModelVersions, depth: int = 0) -> None:
    lineage = record.lineage
    if lineage is None:
        branch.add("[dim]no lineage recorded[/dim]")
        return
    branch.add(f"training data: {lineage.training_data_version or '-'}")
    branch.add(f"training code commit: {lineage.training_code_commit or '-'}")
    params = ", ".join(f"{k}={v}" for k, v in sorted(lineage.hyperparameters.items())) or "-"
    branch.add(f"hyper-parameters: {params}")
    branch.add(f"base model: {lineage.base_model or '-'}")
    parent = lineage.parent_version
    if parent is None:
        branch.add("parent: -")
        return
    node = branch.add(f"parent: {record.name}@{parent}")
    known = model.versions.get(parent)
    if known is None:
        node.add("[dim]not in the registry[/dim]")
    elif depth + 1 >= MAX_ANCESTORS:
        node.add("[dim]…[/dim]")
    else:
        _lineage(node, known, model, depth + 1)


def version_tree(record: ModelSpec, model: ModelVersions) -> Tree:
    """A version: its state, lineage (parents followed), artifacts with their files, needs, and every transition."""
    serving = model.serving is not None and model.serving.version == record.version
    title = f"[bold]{record.name}@{record.version}[/bold] {state_label(record)}{' (serving)' if serving else ''}"
    tree = Tree(f"{title}, owner {record.owner or '-'}, registered {_when(record.registered_at_ms)}")
    if (lora := record.lora) is not None:
        tree.add(f"LoRA adapter of {lora.base_model}, rank {lora.rank}, from {escape(lora.source)}")
    _lineage(tree.add("lineage"), record, model)
    artifacts = tree.add(f"artifacts ({len(record.artifacts)})")
    for artifact in record.artifacts:
        quant = f" {artifact.quantization}" if artifact.quantization else ""
        node = artifacts.add(f"{artifact.format}{quant} {artifact.uri} ({_size(artifact.size_bytes)})")
        for f in artifact.files:
            node.add(f"{f.path} {_size(f.size_bytes)} sha256 {f.sha256[:16]}…")
    hw = record.hardware
    needs = (
        f"{hw.min_vram_per_gpu_gib or '-'} GiB VRAM per GPU, {hw.gpu_count} GPU(s), cpu capable {hw.cpu_capable}"
        if hw is not None
        else "-"
    )
    tree.add(f"hardware: {needs}")
    tree.add(
        f"context {record.max_model_len} tokens, output {record.max_output_tokens}, tokenizer {record.tokenizer or '-'}"
        f", chat template {record.chat_template or '-'}"
    )
    transitions = tree.add("transitions")
    for change in record.transitions:
        transitions.add(escape(step_line(change)))
    return tree


def history_table(name: str, releases: list[ReleaseSummary]) -> Table:
    table = Table(
        "upgrade", "version", "from", "started", "ended", "steps", "outcome", "why", title=f"{name}: releases"
    )
    for r in releases:
        steps = " → ".join(s.release.label() for s in r.steps if s.release is not None)
        table.add_row(
            r.upgrade_id,
            r.version,
            r.previous_version or "-",
            _when(r.started_at_ms),
            _when(r.ended_at_ms),
            steps,
            r.outcome,
            escape(r.reason),
        )
    return table
