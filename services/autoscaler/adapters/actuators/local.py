"""Local actuator: engine-worker processes on this machine, through llmbus.process.detached.

Workers are `llmbus.process.detached.ServiceProcess`es named `<prefix><n>` (pid and log files in the
dev stack's run directory, so `llmbus down` stops them too); on a secured stack they connect as
the worker principal (`worker_env`, which `llmbus up` hands the autoscaler). Scale-down sends SIGTERM: the worker
stops taking work, hands the answers it can over mid-stream after the pool's `handover_grace_s` (their next leg
continues them on another worker), lets the rest finish for the drain grace and exits (engine-worker drain); the
stop runs in the background and the pool counts the worker as gone at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re

from llmbus.process import detached
from llmbus_services.autoscaler.core.config import LocalSpec

log = logging.getLogger(__name__)

ENGINE_WORKER = "llmbus_services.engine_worker"


def _reap_children() -> None:
    """Collect workers that exited on their own: an unreaped child still looks alive to kill(pid, 0)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _slug(pool: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", pool)


class LocalActuator:
    name = "local"

    def __init__(
        self, pools: dict[str, LocalSpec], extra_env: dict[str, str] | None = None, metrics_port_base: int = 0
    ) -> None:
        self.pools = pools
        self.extra_env = extra_env or {}  # e.g. the bus namespace the workers must join
        # Worker n's /metrics port (0: none); a pool's indices start at 1, so pools share one range only
        # when a single pool scales, as in the stacks this project ships.
        self.metrics_port_base = metrics_port_base
        self._stopping: dict[str, asyncio.Task[bool]] = {}  # process name → its background stop

    def _prefix(self, pool: str) -> str:
        return self.pools[pool].worker_prefix or f"{_slug(pool)}-as"

    def process(self, pool: str, index: int) -> detached.ServiceProcess:
        spec = self.pools[pool]
        worker_id = f"{self._prefix(pool)}{index}"
        env = self.extra_env | {
            "LLMBUS_WORKER_WORKER_ID": worker_id,
            "LLMBUS_WORKER_ENGINE": spec.engine,
            "LLMBUS_WORKER_MODEL": pool,
            "LLMBUS_WORKER_DRAIN_GRACE_S": str(spec.drain_grace_s),
            "LLMBUS_WORKER_HANDOVER_GRACE_S": str(spec.handover_grace_s),
            # Never the autoscaler's own port, which every worker would otherwise inherit and die binding.
            "LLMBUS_METRICS_PORT": str(self.metrics_port_base + index if self.metrics_port_base else 0),
        }
        return detached.ServiceProcess(worker_id, ENGINE_WORKER, env | spec.env)

    def running(self, pool: str) -> list[int]:
        """Indices of this pool's live workers that are not being stopped."""
        _reap_children()
        if not detached.run_dir().exists():
            return []
        prefix = self._prefix(pool)
        found = []
        for pid_file in detached.run_dir().glob(f"{prefix}*.pid"):
            suffix = pid_file.stem.removeprefix(prefix)
            if not suffix.isdigit() or pid_file.stem in self._stopping:
                continue
            if detached.pid_of(self.process(pool, int(suffix))) is not None:
                found.append(int(suffix))
        return sorted(found)

    async def replicas(self, pool: str) -> int:
        return len(self.running(pool))

    async def scale(self, pool: str, replicas: int) -> None:
        self._stopping = {name: task for name, task in self._stopping.items() if not task.done()}
        running = self.running(pool)
        if replicas > len(running):
            busy = set(running) | {
                int(n.removeprefix(self._prefix(pool))) for n in self._stopping if n.startswith(self._prefix(pool))
            }
            free = (i for i in range(1, 10_000) if i not in busy)
            for _ in range(replicas - len(running)):
                proc = self.process(pool, next(free))
                pid = await asyncio.to_thread(detached.start, proc)
                log.info("started %s (pid %d) for %s", proc.name, pid, pool)
        for index in reversed(running[replicas:] if replicas < len(running) else []):
            proc = self.process(pool, index)
            log.info("draining %s of %s (SIGTERM)", proc.name, pool)
            grace_s = self.pools[pool].stop_grace_s
            self._stopping[proc.name] = asyncio.create_task(asyncio.to_thread(detached.stop, proc, grace_s))

    async def close(self) -> None:
        """Leave started workers running (they outlive a restart of the autoscaler); finish stops."""
        if self._stopping:
            await asyncio.gather(*self._stopping.values(), return_exceptions=True)
