"""deploy/kafka/kafka.sh stop: a broker gets its controlled shutdown (SIGTERM, then up to
KAFKA_STOP_GRACE_S) before SIGKILL. A process that handles SIGTERM and exits a moment later stands in
for the broker's JVM (`stop` reads the pid file and takes its process for the broker when its command
line names `kafka.Kafka` and this broker's properties); like the JVM, it is not this test's child, so
it is reaped when it exits instead of lingering as a zombie that `kill -0` still finds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from llmbus_tools.harness.service_procs import REPO

# Writes `stopped` and exits about a second after SIGTERM, as a broker ending its controlled shutdown.
SLOW_TO_STOP = """
import pathlib, signal, sys, time
def shut_down(*_):
    time.sleep(1)
    pathlib.Path(sys.argv[1]).write_text("stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, shut_down)
pathlib.Path(sys.argv[2]).write_text("ready")
while True:
    time.sleep(0.1)
"""


def stop(run_dir: Path, grace_s: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    stopped, ready = run_dir / "stopped", run_dir / "ready"
    # Started in the background of a shell that exits at once: the stand-in is nobody's child here.
    background = 'setsid "$0" -c "$1" "$2" "$3" kafka.Kafka "$4" >/dev/null 2>&1 & echo $!'
    properties = run_dir / "kafka-fake.server.properties"
    pid = subprocess.run(
        ["bash", "-c", background, sys.executable, SLOW_TO_STOP, str(stopped), str(ready), str(properties)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    deadline = time.monotonic() + 30
    while not ready.exists():  # its SIGTERM handler is set
        assert time.monotonic() < deadline, "the stand-in broker did not start"
        time.sleep(0.05)
    (run_dir / "kafka-fake.pid").write_text(pid)
    return kafka_sh(run_dir, "stop", grace_s), stopped.exists()


def kafka_sh(run_dir: Path, command: str, grace_s: str = "10") -> subprocess.CompletedProcess[str]:
    env = os.environ | {"KAFKA_RUN_DIR": str(run_dir), "KAFKA_NAME": "kafka-fake", "KAFKA_STOP_GRACE_S": grace_s}
    return subprocess.run(
        [str(REPO / "deploy/kafka/kafka.sh"), command], env=env, capture_output=True, text=True, timeout=60
    )


def test_stop_waits_for_a_controlled_shutdown(tmp_path: Path) -> None:
    done, shut_down_cleanly = stop(tmp_path, "10")
    assert done.returncode == 0, done.stderr
    assert "killing" not in done.stdout + done.stderr and "error" not in done.stderr, done.stderr
    assert shut_down_cleanly  # it finished its shutdown: not SIGKILLed
    assert not (tmp_path / "kafka-fake.pid").exists()


def test_a_grace_of_zero_kills_at_once(tmp_path: Path) -> None:
    done, shut_down_cleanly = stop(tmp_path, "0")
    assert done.returncode == 0, done.stderr
    assert "killing" in done.stdout + done.stderr
    assert not shut_down_cleanly


def test_a_pid_file_naming_another_process_is_not_a_broker(tmp_path: Path) -> None:
    """A pid file left by a broker that died with its machine names a dead pid, or one reused since: `start`
    must not read it as its new broker having exited (CI's `make infra` did), `stop` must not kill it."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "kafka-fake.pid").write_text(str(other.pid))
        status = kafka_sh(tmp_path, "status")
        assert (status.returncode, status.stdout.strip()) == (1, "stopped")
        done = kafka_sh(tmp_path, "stop")
        assert done.returncode == 0 and "not running" in done.stdout + done.stderr, done.stderr
        assert other.poll() is None  # still alive: not this broker, not killed
    finally:
        other.kill()
        other.wait(timeout=10)
