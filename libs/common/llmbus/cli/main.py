"""`llmbus`: bring the local stack up, chat through it, look at the fleet."""

from __future__ import annotations

import asyncio
import urllib.request

import typer
from rich.console import Console

from llmbus.bus.admin import ensure_catalog
from llmbus.bus.tables import read_table
from llmbus.cli import acl, dlq, keys, scaling, stack, trace
from llmbus.cli import costs as cost_commands
from llmbus.cli.archive import archive_app
from llmbus.cli.audit import audit_command
from llmbus.cli.chat_view import show_stream
from llmbus.cli.experiments import experiments_app
from llmbus.cli.export import export_app
from llmbus.cli.feedback import feedback as feedback_command
from llmbus.cli.fleet_view import (
    GONE_AFTER_S,
    cold_start_table,
    fleet_table,
    heard_recently,
    metrics_table,
    nodes_table,
    state_reasons,
)
from llmbus.cli.gc import gc as gc_command
from llmbus.cli.models import models_app
from llmbus.cli.router_cmds import router_app
from llmbus.cli.tools import TOOL_COMMAND
from llmbus.cli.workers import workers_app
from llmbus.client import LlmbusClient, ready_workers
from llmbus.contract import topics as t
from llmbus.contract.messages import AUTO_MODEL, ChatMessage, InferenceRequest, NodeProfile, WorkerStatus, now_ms
from llmbus.process import detached
from llmbus.settings import BusSettings

app = typer.Typer(help="llmbus: a Kafka-native control plane for LLM inference clusters", no_args_is_help=True)
console = Console()
app.command("audit")(audit_command)
for command in (cost_commands.costs, cost_commands.plan, cost_commands.pricebook):
    app.command(context_settings=TOOL_COMMAND)(command)
app.add_typer(models_app, name="models")
app.add_typer(workers_app, name="workers")
app.add_typer(experiments_app, name="experiments")
app.add_typer(router_app, name="router")
app.add_typer(export_app, name="export")
app.add_typer(archive_app, name="archive")
app.add_typer(keys.app, name="keys")
app.add_typer(acl.app, name="acl")
app.add_typer(dlq.app, name="dlq")
app.command()(trace.trace)
app.command("feedback")(feedback_command)
app.command("gc")(gc_command)


@app.command()
def up(
    workers: int = typer.Option(2, help=f"sim engine-workers of {stack.SIM_MODEL} (besides one per policy tier)"),
    sim_speedup: float = typer.Option(1.0, help="sim engine time compression (0 = no time)"),
    demo: bool = typer.Option(True, help="stream a demo answer once the stack is ready"),
) -> None:
    """Start Kafka, Redis, the object store, the topics and the services, then stream a demo answer."""
    console.print("[bold]Kafka, Redis and the object store[/bold]")
    stack.infra_up()
    settings = BusSettings()
    created = asyncio.run(ensure_catalog(settings))
    console.print(f"topics: {len(created)} created, catalog verified")
    for proc in stack.default_services(workers, sim_speedup):
        pid = stack.start(proc)
        console.print(f"  {proc.name:<10} pid {pid:<7} log {proc.log_file}")
    ready = asyncio.run(_wait_ready(settings, workers + len(stack.TIER_FLEET), timeout_s=120))
    console.print(f"{ready} worker(s) ready: every model of the default policy is served")
    if demo:
        stack.stack_auth.speak_as_tenant(detached.run_dir())
        demo_request = InferenceRequest(
            messages=[ChatMessage(role="user", content="Explain in one sentence why Kafka suits LLM request routing.")],
            model=AUTO_MODEL,
            max_tokens=40,
        )
        if not stream_answer(demo_request):
            raise typer.Exit(1)


@app.command()
def down(infra: bool = typer.Option(True, help="also stop Kafka, Redis and the object store")) -> None:
    """Stop the services (they drain), then Kafka, Redis and the object store."""
    for proc in stack.running_services():
        if detached.stop(proc):
            console.print(f"stopped {proc.name}")
    if infra:
        stack.infra_down()


@app.command()
def chat(
    text: str,
    model: str = typer.Option(AUTO_MODEL, help=f"model to ask; {AUTO_MODEL!r}: the router's policy chooses"),
    max_tokens: int = typer.Option(64),
    tenant: str = typer.Option("default"),
    temperature: float | None = typer.Option(None, help="sampling temperature; unset: the model's own default"),
    category: str | None = typer.Option(None, help="routing hint, e.g. chat, quick_edit, tab_completion"),
    token_budget: int | None = typer.Option(None, help="routing hint: the caller's token budget"),
    session: str | None = typer.Option(None, help="session id: its turns stay on one worker (prefix affinity)"),
    priority: int = typer.Option(0, min=0, max=9, help="0 = most urgent"),
    suffix: str | None = typer.Option(
        None, help="fill-in-the-middle: TEXT is what comes before the insertion point, this what comes after"
    ),
) -> None:
    """Send one request through the bus and stream the answer token by token."""
    # With a suffix, TEXT is a completion prompt (the prefix), as /v1/completions sends it.
    request = InferenceRequest(
        messages=[ChatMessage(role="user", content=text)] if suffix is None else [],
        prompt=None if suffix is None else text,
        suffix=suffix,
        model=model,
        max_tokens=max_tokens,
        tenant=tenant,
        temperature=temperature,
        category=category,
        token_budget=token_budget,
        session_id=session,
        priority=priority,
    )
    if not stream_answer(request):
        raise typer.Exit(1)


def stream_answer(request: InferenceRequest) -> bool:
    """Send `request` through the bus and print its answer as it streams; False when it ended in an error.

    A plain function, so that other commands (`up`'s demo) build their request themselves instead of
    calling the `chat` command, whose defaults are typer's option objects outside the command line."""

    async def _stream() -> bool:
        console.print(f"[dim]request {request.request_id} → {request.model or 'the policy'}[/dim]")
        async with LlmbusClient() as client:
            shown = await show_stream(client.stream_text(request), console)
        return shown.error is None

    return asyncio.run(_stream())


@app.command()
def status(
    nodes: bool = typer.Option(False, "--nodes", help="The nodes by hardware class: GPUs, memory, peak, ECC, health."),
    all_workers: bool = typer.Option(
        False, "--all", help=f"Also the workers not heard from for over {GONE_AFTER_S / 60:.0f} min (gone)."
    ),
) -> None:
    """The fleet as its latest heartbeats describe it."""
    fleet = asyncio.run(_read_fleet(BusSettings()))
    if not all_workers:
        recent, gone = heard_recently(list(fleet.values()), now_ms())
        fleet = {s.worker_id: s for s in recent}
        if gone:
            minutes = f"{GONE_AFTER_S / 60:.0f}"
            console.print(f"{gone} worker(s) not heard from for over {minutes} min left out (llmbus status --all)")
    if nodes:
        profiles = asyncio.run(_read_nodes(BusSettings()))
        console.print(nodes_table(list(profiles.values()), list(fleet.values())))
        return
    console.print(fleet_table(list(fleet.values())))
    for line in state_reasons(list(fleet.values())):
        console.print(line, soft_wrap=True, highlight=False, markup=False)
    if phases := cold_start_table(list(fleet.values())):
        console.print(phases)
    scaling.print_scaling(console, BusSettings(), fleet)
    if urls := stack.metrics_urls():
        console.print(metrics_table(urls, {name: _answers(url) for name, url in urls.items()}))


@app.command()
def topics() -> None:
    """Create or verify every topic of the catalog."""
    created = asyncio.run(ensure_catalog(BusSettings()))
    console.print(f"created: {created or 'none'}; all {len(t.CATALOG)} catalog topics present")


def _answers(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # our own loopback URLs
            return bool(response.status == 200)
    except OSError:
        return False


async def _read_fleet(settings: BusSettings) -> dict[str, WorkerStatus]:
    return await read_table(settings, t.Topics(settings.topic_prefix).name(t.WORKERS), WorkerStatus)


async def _read_nodes(settings: BusSettings) -> dict[str, NodeProfile]:
    return await read_table(settings, t.Topics(settings.topic_prefix).name(t.NODES), NodeProfile)


async def _wait_ready(settings: BusSettings, workers: int, timeout_s: float) -> int:
    return len(await ready_workers(settings, lambda ready: len(ready) >= workers, timeout_s))


if __name__ == "__main__":
    app()
