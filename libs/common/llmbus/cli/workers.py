"""`llmbus workers`: engine-workers of registered model versions as processes of the local stack.

`llmbus workers start NAME@VERSION` starts one the way `llmbus up` starts its services (a detached
process with its pid and log files in the run directory, as its own principal on a secured stack, so
`llmbus down` stops it too): LLMBUS_WORKER_MODEL_REF makes it fetch and verify the version's artifact
from the object store before it builds its engine (services/engine_worker/README.md). With `--wait`
(the default) the command follows the worker's heartbeats on llm.workers until it is ready, printing
its cold start by phase, or until its start failed, printing why.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from enum import StrEnum

import typer
from rich.console import Console
from rich.markup import escape

from llmbus.bus import BadMessage, decode
from llmbus.cli import stack
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import WorkerState, WorkerStatus
from llmbus.domain.registry import RegistryError, parse_ref
from llmbus.process import detached
from llmbus.process.detached import ServiceProcess
from llmbus.settings import BusSettings

workers_app = typer.Typer(help="engine-workers of model versions on the local stack", no_args_is_help=True)
console = Console()
ENGINE_WORKER = "llmbus_services.engine_worker"


class Engine(StrEnum):
    vllm = "vllm"  # the version's files, loaded by vLLM (the CPU build without a GPU)
    sim = "sim"  # fetched and verified all the same; answers from the simulator, quick to start


def worker_id_for(name: str, version: str, engine: str) -> str:
    """`tiny@2` on vllm → `tiny-v2-vllm`: a name a dispatch topic (llm.dispatch.<id>) can carry."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{name}-v{version}-{engine}")


def worker_env(ref: str, worker_id: str, engine: str, extra: list[str]) -> dict[str, str]:
    env = {"LLMBUS_WORKER_WORKER_ID": worker_id, "LLMBUS_WORKER_ENGINE": engine, "LLMBUS_WORKER_MODEL_REF": ref}
    for item in extra:
        key, equals, value = item.partition("=")
        if not (key and equals):
            raise ValueError(f"-e {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


@workers_app.command("start")
def workers_start(
    ref: str = typer.Argument(..., help="NAME@VERSION of a registered version"),
    engine: Engine = typer.Option(Engine.vllm, help="vllm serves the version's files; sim simulates it"),
    worker_id: str | None = typer.Option(None, "--id", help="default: <name>-v<version>-<engine>"),
    env: list[str] = typer.Option([], "-e", "--env", help="KEY=VALUE for the worker (repeatable)"),
    wait: bool = typer.Option(True, help="until it is ready (exit 0) or its start failed (exit 1)"),
    timeout_s: float = typer.Option(600.0, help="how long --wait waits (then exit 2)"),
) -> None:
    """Start an engine-worker that fetches, verifies, loads and warms the version, then serves it."""
    try:
        name, version = parse_ref(ref)
        if version is None:
            raise RegistryError("name the version: NAME@VERSION")
        worker_id = worker_id or worker_id_for(name, version, engine.value)
        proc = ServiceProcess(worker_id, ENGINE_WORKER, worker_env(ref, worker_id, engine.value, env))
    except (RegistryError, ValueError) as exc:
        console.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(2) from None
    if (pid := detached.pid_of(proc)) is not None:
        console.print(f"{worker_id} runs already (pid {pid}); --id starts another")
        return
    if not wait:
        pid = stack.start(proc)
        console.print(f"{worker_id}: pid {pid}, log {proc.log_file}")
        return
    status, exit_code = asyncio.run(_start_and_follow(BusSettings(), proc, timeout_s))
    console.print(f"{worker_id} ({ref}, {engine.value}): {escape(status)}")
    if exit_code:
        console.print(f"its log: {proc.log_file}")
        raise typer.Exit(exit_code)


@workers_app.command("stop")
def workers_stop(
    worker_ids: list[str] = typer.Argument(..., help="worker ids, as `llmbus workers start` printed them"),
) -> None:
    """Stop workers started here: SIGTERM, so each drains (hands back what it holds) before it exits."""
    for worker_id in worker_ids:
        stopped = detached.stop(ServiceProcess(worker_id, ENGINE_WORKER))
        console.print(f"{worker_id}: {'stopped' if stopped else 'not running'}")


async def _start_and_follow(settings: BusSettings, proc: ServiceProcess, timeout_s: float) -> tuple[str, int]:
    """Start the worker and read its heartbeats: (what to say, exit status 0 ready / 1 failed / 2 timed out)."""
    tail = await TopicTail(settings, t.Topics(settings.topic_prefix).name(t.WORKERS)).start()  # before the start
    try:
        pid = stack.start(proc)
        deadline = time.monotonic() + timeout_s
        last: WorkerStatus | None = None
        while time.monotonic() < deadline:
            async for record in tail.records(1.0):
                try:
                    status = decode(record, WorkerStatus)  # type: ignore[arg-type]
                except BadMessage:
                    continue
                if status.worker_id != proc.name:
                    continue
                last = status
                if status.state == WorkerState.READY:
                    return _ready(status), 0
                if status.state == WorkerState.FAILED:
                    return f"failed{await _exited(pid)}: {status.state_reason}", 1
            if (code := _exit_status(pid)) is not None:
                return f"exited with status {code} before it was ready", 1
        doing = f"{last.state}: {last.state_reason or '-'}" if last is not None else "no heartbeat yet"
        return f"not ready after {timeout_s:.0f} s ({doing})", 2
    finally:
        await tail.stop()


def _ready(status: WorkerStatus) -> str:
    phases = "  ".join(f"{phase} {secs:.2f}" for phase, secs in status.cold_start_phases_s.items())
    cold = f"{status.cold_start_s:.1f} s" if status.cold_start_s is not None else "-"
    return f"ready, format {status.model_format or '-'}, cold start {cold}: {phases}"


async def _exited(pid: int, wait_s: float = 30.0) -> str:
    """` (exit status N)` once the failed worker has exited (it does right after its last heartbeat)."""
    deadline = time.monotonic() + wait_s
    while (code := _exit_status(pid)) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return f" (exit status {code})" if code is not None else ""


def _exit_status(pid: int) -> int | None:
    """The worker's exit status once it has exited (it is this process's child), else None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not ours to reap: gone or not our child
        return None
    return os.waitstatus_to_exitcode(status) if done else None
