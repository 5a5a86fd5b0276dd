"""What the peer benchmark puts load on: the upstream itself, TensorZero and LiteLLM in front of it.

Each is a `Target`: the OpenAI-compatible root the drivers call, the model name it answers to, the
headers it wants, and the processes whose CPU is its cost (a role's CPU includes its children:
LiteLLM's workers are children of its master). The llmbus stack is in bench.peer_llmbus.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench import peer_venvs
from llmbus.process.launch import checkout_pythonpath
from llmbus.settings import BusSettings
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.service_procs import REPO

UPSTREAM_MODEL = "det"
# LiteLLM refuses to start without a master key; every request then carries it, as a deployment's would.
LITELLM_KEY = "sk-peer-bench-0123456789abcdef"


@dataclass
class Target:
    name: str
    base_url: str  # the OpenAI root: POST {base_url}/chat/completions
    model: str
    roles: dict[str, int]  # role → pid of the processes that are this target's cost
    headers: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    bus_settings: BusSettings | None = None  # llmbus's namespace: what it carried per request is counted

    @property
    def root_url(self) -> str:
        """The URL inference-perf takes (it appends /v1/chat/completions itself)."""
        return self.base_url.removesuffix("/v1")


class Child:
    """A process in a session of its own, its output in a log; stopped with its whole process group."""

    def __init__(self, name: str, command: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                list(command),
                env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_for_line(self, prefix: str, timeout_s: float) -> str:
        """The rest of the first log line starting with `prefix`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} printed no {prefix!r} within {timeout_s:.0f}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 30) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


async def wait_http(url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
    """Until `url` answers 200."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url, headers=headers)).status_code == 200:
                    return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f}s")


@contextlib.asynccontextmanager
async def upstream(log_dir: Path, answer_tokens: int) -> AsyncIterator[Target]:
    """The zero-cost upstream (bench.peer_upstream) in its own process: the baseline every path stands on.
    Its answers are at most `answer_tokens` long, whatever a driver asks for."""
    child = Child(
        "upstream",
        [sys.executable, "-m", "bench.peer_upstream", "--port", "0", "--answer-tokens", str(answer_tokens)],
        log_dir,
        env={"PYTHONPATH": checkout_pythonpath(REPO)},
    )
    try:
        url = child.wait_for_line("upstream on ", 60)
        yield Target("upstream direct", url, UPSTREAM_MODEL, {"upstream": child.proc.pid})
    finally:
        child.stop()


def tensorzero_config(upstream_url: str) -> str:
    """One model, one OpenAI-compatible provider (the upstream), no observability store (none here)."""
    return (
        "[gateway.observability]\nenabled = false\n\n"
        f'[models.{UPSTREAM_MODEL}]\nrouting = ["upstream"]\n\n'
        f"[models.{UPSTREAM_MODEL}.providers.upstream]\n"
        f'type = "openai"\nmodel_name = "{UPSTREAM_MODEL}"\napi_base = "{upstream_url}/"\napi_key_location = "none"\n'
    )


@contextlib.asynccontextmanager
async def tensorzero(upstream_url: str, log_dir: Path) -> AsyncIterator[Target]:
    venv = peer_venvs.tensorzero().ensure()
    config = log_dir / "tensorzero.toml"
    config.write_text(tensorzero_config(upstream_url))
    child = Child(
        "tensorzero", [str(venv.bin("python")), str(REPO / "bench" / "peer_tensorzero_serve.py"), str(config)], log_dir
    )
    try:
        base_url = child.wait_for_line("base_url ", 120)
        target = Target(
            "TensorZero",
            base_url,
            f"tensorzero::model_name::{UPSTREAM_MODEL}",
            {"tensorzero": child.proc.pid},
            versions={"tensorzero": venv.version_of("tensorzero"), "tensorzero python": venv.python_version()},
            notes=["TensorZero's Rust gateway from its PyPI wheel (tensorzero._start_http_gateway), observability off"],
        )
        yield target
    finally:
        child.stop()


def litellm_config(upstream_url: str) -> str:
    return (
        "model_list:\n"
        f"  - model_name: {UPSTREAM_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{UPSTREAM_MODEL}\n"
        f"      api_base: {upstream_url}\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )


@contextlib.asynccontextmanager
async def litellm(upstream_url: str, log_dir: Path, workers: int = 2) -> AsyncIterator[Target]:
    venv = peer_venvs.litellm().ensure()
    config = log_dir / "litellm.yaml"
    config.write_text(litellm_config(upstream_url))
    port = free_port()
    env = {
        "LITELLM_MASTER_KEY": LITELLM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the price list from the internet
        "LITELLM_TELEMETRY": "False",
    }
    command = [str(venv.bin("litellm")), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    child = Child("litellm", [*command, "--num_workers", str(workers)], log_dir, env=env)
    try:
        headers = {"authorization": f"Bearer {LITELLM_KEY}"}
        try:
            await wait_http(f"http://127.0.0.1:{port}/health/liveliness", 600, headers)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; its log ends:\n{child.tail(15)}") from exc
        yield Target(
            f"LiteLLM ({workers} workers)",
            f"http://127.0.0.1:{port}/v1",
            UPSTREAM_MODEL,
            {"litellm": child.proc.pid},
            headers=headers,
            versions={"litellm": venv.version_of("litellm"), "litellm python": venv.python_version()},
            notes=[f"LiteLLM proxy, {workers} uvicorn workers, master key set, defaults otherwise"],
        )
    finally:
        child.stop()
