"""deploy/objectstore/objectstore.sh without starting a server: a pid file naming another process is not the
store (status says stopped, stop kills nothing), and `env` prints the settings that reach the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmbus.settings import ObjectStoreSettings
from llmbus_tools.harness.service_procs import REPO


def objectstore_sh(run_dir: Path, command: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"OBJECTSTORE_RUN_DIR": str(run_dir), "OBJECTSTORE_NAME": "os-fake", "OBJECTSTORE_PORT": "19999"}
    script = REPO / "deploy/objectstore/objectstore.sh"
    return subprocess.run([str(script), command], env=env, capture_output=True, text=True, timeout=60)


def test_a_pid_file_naming_another_process_is_not_the_store(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "os-fake.pid").write_text(str(other.pid))
        status = objectstore_sh(tmp_path, "status")
        assert (status.returncode, status.stdout.strip()) == (1, "stopped")
        done = objectstore_sh(tmp_path, "stop")
        assert done.returncode == 0 and "not running" in done.stderr, done.stderr
        assert other.poll() is None  # still alive: not the store, not killed
    finally:
        other.kill()
        other.wait(timeout=10)


def test_env_prints_the_settings_that_reach_the_store(tmp_path: Path) -> None:
    assert objectstore_sh(tmp_path, "env").returncode == 1  # no credentials yet: nothing to print
    (tmp_path / "os-fake.credentials").write_text("access_key=llmbus-ab12\nsecret_key=s3cr3t\n")
    printed = objectstore_sh(tmp_path, "env")
    assert printed.stdout.splitlines() == [
        "LLMBUS_S3_ENDPOINT=http://127.0.0.1:19999",
        "LLMBUS_S3_ACCESS_KEY=llmbus-ab12",
        "LLMBUS_S3_SECRET_KEY=s3cr3t",
    ]
    # The settings read the same file when the keys are not set.
    settings = ObjectStoreSettings(access_key=None, secret_key=None, credentials_file=tmp_path / "os-fake.credentials")
    assert settings.keys() == ("llmbus-ab12", "s3cr3t")
