"""One way to start a service as its own process: `python -m <module>`, output appended to a log file.

The CLI's dev stack, the tests' ServiceProc and the benchmarks all start services through this, so
a service runs the same way under each: unbuffered output, no stdin, and the namespace settings of
the caller's BusSettings in its environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from llmbus.settings import BusSettings

# A checkout's own import path. The folder services/ installs as `llmbus_services` (setup.py maps it);
# without that install, scripts/pythonpath/ holds a link of that name to services/.
CHECKOUT_IMPORT_ROOTS = ("libs/common", ".", "scripts/pythonpath")


def checkout_pythonpath(tree: Path) -> str:
    """PYTHONPATH that runs `tree`'s own llmbus, llmbus_services, llmbus_tools, tests and bench, ahead of
    whatever llmbus the interpreter has installed (another checkout's editable install, say).

    A tree from before the rename has no link: its children would import the installed services
    instead of its own, so it is refused rather than measured by mistake."""
    tree = tree.resolve()
    if not (tree / CHECKOUT_IMPORT_ROOTS[-1] / "llmbus_services").is_dir():
        raise ValueError(f"{tree} has no {CHECKOUT_IMPORT_ROOTS[-1]}/llmbus_services (a tree from before the rename)")
    return os.pathsep.join(str(tree / root) for root in CHECKOUT_IMPORT_ROOTS)


def bus_env(settings: BusSettings) -> dict[str, str]:
    """The LLMBUS_* variables that put a child on the same broker, Redis and topic namespace as `settings`."""
    return {
        "LLMBUS_TOPIC_PREFIX": settings.topic_prefix,
        "LLMBUS_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "LLMBUS_REDIS_URL": settings.redis_url,
        "LLMBUS_REDIS_CLUSTER": "true" if settings.redis_cluster else "false",
        # Topics a service creates (its dispatch or reply topic) get the caller's replication.
        "LLMBUS_REPLICATION_FACTOR": str(settings.replication_factor),
        "LLMBUS_MIN_INSYNC_REPLICAS": str(settings.min_insync_replicas),
        # A scenario that lengthens group sessions (a replicated broker's failover) lengthens its children's.
        "LLMBUS_SESSION_TIMEOUT_MS": str(settings.session_timeout_ms),
        "LLMBUS_LOG_JSON": "false",
    }


def spawn_module(
    module: str,
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path,
    python_args: Sequence[str] = (),
    own_session: bool = False,
) -> subprocess.Popen[bytes]:
    """`python [python_args] -m module` with exactly `env` (plus PYTHONUNBUFFERED), stdout and stderr
    appended to `log_path`. `own_session`: the child outlives its parent's terminal (`llmbus up`)."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, *python_args, "-m", module],
            cwd=cwd,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=own_session,
        )
