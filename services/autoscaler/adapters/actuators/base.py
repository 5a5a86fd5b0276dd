"""One interface for whatever runs a pool's workers: local processes, a Kubernetes Deployment."""

from __future__ import annotations

from typing import Protocol


class Actuator(Protocol):
    name: str

    async def replicas(self, pool: str) -> int:
        """Workers the pool has now (started, warming or ready; not those draining away)."""
        ...

    async def scale(self, pool: str, replicas: int) -> None:
        """Make the pool `replicas` workers: start new ones, or drain and stop the surplus."""
        ...

    async def close(self) -> None: ...


class NoActuator:
    """Dry run: decisions are published, nothing is started or stopped."""

    name = "none"

    def __init__(self) -> None:
        self._replicas: dict[str, int] = {}

    async def replicas(self, pool: str) -> int:
        return self._replicas.get(pool, 0)

    async def scale(self, pool: str, replicas: int) -> None:
        self._replicas[pool] = replicas

    async def close(self) -> None:
        return None
