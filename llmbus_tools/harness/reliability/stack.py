"""A fault scenario's stack: real service processes, each as its own principal on the deployment's secured
broker with the shipped defaults (llmbus_tools.harness.reliability.deployment), supervised as systemd
or Kubernetes would (a service that exits by itself is started again, and noted).

Services are `llmbus_tools.harness.service_procs.ServiceProc` processes; names are stable across restarts.
The one setting given to every worker is the sim engine's speed-up (the workload's model, not a
reliability setting); a scenario that needs another value passes it to the one service it concerns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from llmbus.contract import topics as t
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.service_procs import ServiceProc, wait_workers_ready

log = logging.getLogger(__name__)
# Sim workers generate at 50x the modelled speed: a scenario's load finishes in seconds, not minutes.
WORKER_ENV = {"LLMBUS_WORKER_SIM_SPEEDUP": "50"}


@dataclass
class Stack:
    """router(s) → scheduler(s) → sim workers, and the services beside them, each a ServiceProc."""

    deployment: Deployment
    log_dir: Path
    procs: dict[str, ServiceProc] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # stopped on purpose: not restarted by `supervise`
    crashes: list[str] = field(default_factory=list)

    @property
    def settings(self) -> BusSettings:
        """What every service shares: the namespace, the broker's address and Redis."""
        return self.deployment.base

    def add(self, name: str, module: str, principal: str, env: dict[str, str] | None = None) -> ServiceProc:
        own = self.deployment.env(principal) | (env or {})
        proc = ServiceProc(module, self.settings, env=own, log_dir=self.log_dir, name=name)
        self.procs[name] = proc.start()
        return proc

    def router(self, name: str = "router", env: dict[str, str] | None = None) -> ServiceProc:
        return self.add(name, "llmbus_services.router", t.ROUTER, env)

    def scheduler(self, name: str = "scheduler", env: dict[str, str] | None = None) -> ServiceProc:
        # A stable instance id: a restarted scheduler resumes its own outcomes group.
        own = {"LLMBUS_SCHEDULER_INSTANCE_ID": f"{self.settings.topic_prefix}{name}"}
        return self.add(name, "llmbus_services.scheduler", t.SCHEDULER, own | (env or {}))

    def worker(self, worker_id: str, env: dict[str, str] | None = None) -> ServiceProc:
        own = WORKER_ENV | {"LLMBUS_WORKER_WORKER_ID": worker_id}
        return self.add(worker_id, "llmbus_services.engine_worker", t.WORKER, own | (env or {}))

    def shadow_worker(self, worker_id: str, model: str) -> ServiceProc:
        return self.worker(worker_id, {"LLMBUS_WORKER_MODEL": model})

    def autoscaler(self, env: dict[str, str], name: str = "autoscaler") -> ServiceProc:
        return self.add(name, "llmbus_services.autoscaler", t.AUTOSCALER, env)

    def cost(self, name: str = "cost", env: dict[str, str] | None = None) -> ServiceProc:
        return self.add(name, "llmbus_services.cost_accounting", t.COST, env)

    def comparator(self, name: str = "comparator", env: dict[str, str] | None = None) -> ServiceProc:
        return self.add(name, "llmbus_services.shadow_comparator", t.COMPARATOR, env)

    def gateway(self, port: int, instance_id: str, name: str = "gateway") -> ServiceProc:
        env = {"LLMBUS_GATEWAY_PORT": str(port), "LLMBUS_GATEWAY_INSTANCE_ID": instance_id}
        return self.add(name, "llmbus_services.gateway", t.GATEWAY, env)

    def kill(self, name: str) -> None:
        """SIGKILL; the service stays down until `restart` (the supervisor leaves it alone)."""
        self.down.add(name)
        self.procs[name].kill()

    def restart(self, name: str) -> None:
        proc = self.procs[name].proc
        assert proc is None or proc.poll() is not None, f"{name} is still running: a second copy would orphan it"
        self.procs[name].start()
        self.down.discard(name)

    def retire(self, name: str) -> None:
        """SIGTERM and wait: a replica removed on purpose (it drains)."""
        self.down.add(name)
        self.procs[name].terminate(60)

    async def supervise(self) -> None:
        """What systemd or Kubernetes does: a service that exits by itself is started again (and noted)."""
        while True:
            await asyncio.sleep(0.5)
            for name, proc in self.procs.items():
                if name not in self.down and proc.proc is not None and proc.proc.poll() is not None:
                    self.crashes.append(f"{name} exited with {proc.proc.returncode}; restarted")
                    log.warning("%s exited with %s; restarting", name, proc.proc.returncode)
                    proc.start()

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name].proc
        assert proc is not None and proc.poll() is None, f"{name} is not running"
        os.kill(proc.pid, sig)

    def pids(self) -> dict[str, int]:
        return {n: p.proc.pid for n, p in self.procs.items() if p.proc is not None and p.proc.poll() is None}

    def stop_all(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, OSError):
                if proc.proc is not None and proc.proc.poll() is None:
                    os.kill(proc.proc.pid, signal.SIGCONT)  # a SIGSTOPped one would ignore the kill's wait
            proc.kill()

    def logs(self, lines: int = 25) -> str:
        return "\n".join(f"--- {n} ---\n{p.log_tail(lines)}" for n, p in self.procs.items())

    async def workers_ready(self, workers: list[str], timeout_s: float = 180) -> None:
        await wait_workers_ready(self.deployment.operator, set(workers), timeout_s)
