"""Prometheus 3 beside the smoke's stack: the compose file's official image is prom/prometheus:v3.0.1,
the locally built one Debian's 2.x, so the smoke also runs a v3 server (deploy/prometheus/build-v3.sh,
built from its Go module) on the host's loopback with the stack's own prometheus.yml, alert rules and
consoles, and checks them on both."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from project import CACHE, HERE, Stack
from steps import http_json, run, say, step, wait_for

VERSION = "3.0.1"
PORT_SUFFIX = "9091"  # after the stack's port prefix, beside its own Prometheus on <P>9090
PROMETHEUS_DIR = HERE.parent / "prometheus"


def build() -> Path:
    """The v3 binary, built once into the cache (minutes on 2 cores)."""
    binary = CACHE / f"prometheus-{VERSION}" / "prometheus"
    if not binary.exists():
        with step(f"Prometheus {VERSION} from its Go module (once)"):
            run([str(PROMETHEUS_DIR / "build-v3.sh")], timeout_s=1800, show=True)
    return binary


def config_for(stack: Stack, workdir: Path) -> Path:
    """The stack's prometheus.yml as run.sh renders it in the container, with the rules' path on the host."""
    text = (PROMETHEUS_DIR / "prometheus.yml").read_text().replace("@P@", stack.prefix)
    text = text.replace("/etc/prometheus/alerts.yml", str(PROMETHEUS_DIR / "alerts.yml"))
    config = workdir / "prometheus.yml"
    config.write_text(text)
    return config


@contextlib.contextmanager
def beside(stack: Stack) -> Iterator[None]:
    """Prometheus 3 scraping the stack while the block runs; stopped (by its process) after."""
    binary = build()
    url = f"http://127.0.0.1:{stack.port(PORT_SUFFIX)}"
    with (
        tempfile.TemporaryDirectory(prefix="llmbus-prometheus3.") as workdir,
        open(Path(workdir) / "prometheus.log", "w") as log,
    ):
        server = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config_for(stack, Path(workdir))}",
                f"--storage.tsdb.path={workdir}/data",
                f"--web.listen-address=127.0.0.1:{stack.port(PORT_SUFFIX)}",
                f"--web.console.templates={PROMETHEUS_DIR / 'consoles'}",
                f"--web.console.libraries={PROMETHEUS_DIR / 'console_libraries'}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

        def ready() -> bool:
            with contextlib.suppress(OSError, ValueError, KeyError):
                return str(http_json(f"{url}/api/v1/status/buildinfo")["data"]["version"]) == VERSION
            return False

        def exited() -> str | None:
            return None if server.poll() is None else f"exited {server.returncode}"

        try:
            with step(f"Prometheus {VERSION} beside the stack on 127.0.0.1:{stack.port(PORT_SUFFIX)}"):
                wait_for(f"Prometheus {VERSION} answering", ready, 60, exited)
            yield
        except BaseException:
            say(f"---- log of Prometheus {VERSION} (last lines)")
            say((Path(workdir) / "prometheus.log").read_text()[-3000:])
            raise
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
