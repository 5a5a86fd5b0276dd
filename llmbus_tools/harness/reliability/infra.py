"""Private infrastructure a fault scenario may break: a broker (secured as deployed, or plain), a Redis.

Both come from the project's own scripts (deploy/kafka/kafka.sh, deploy/redis/redis.sh) on other
ports and data dirs, so the shared ones on 9092 and 6379 are never touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as redis

from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.secured import SecuredBroker, read_credentials
from llmbus_tools.harness.service_procs import REPO

# A broker that lives a minute or two: the quick compiler only and the serial collector (a third less CPU
# to start than the default G1 with both compilers).
SHORT_LIVED_BROKER_JVM_FLAGS = "-Xms256m -Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:CICompilerCount=1"


@dataclass
class PrivateKafka:
    """A broker of our own that a test may stop. With `tenants`, secured as deployed (KAFKA_AUTH=scram:
    SASL/SCRAM, ACLs enforced, a SCRAM user per service, operator, analytics and tenant)."""

    run_dir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    jvm_flags: str = SHORT_LIVED_BROKER_JVM_FLAGS  # a benchmark's broker takes the steady-state ones
    tenants: list[str] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"kafka-{self.port}"

    @property
    def secured(self) -> SecuredBroker:
        assert self.tenants is not None, "a plain broker has no principals"
        return SecuredBroker(self.bootstrap, read_credentials(self.run_dir / f"{self.name}.credentials"))

    def _script(self, action: str) -> None:
        env = os.environ | {
            "KAFKA_PORT": str(self.port),
            "KAFKA_CONTROLLER_PORT": str(self.controller_port),
            "KAFKA_DATA_DIR": str(self.run_dir / "kafka-data"),
            "KAFKA_RUN_DIR": str(self.run_dir),
            "KAFKA_NAME": self.name,
            "KAFKA_READY_TIMEOUT_S": "240",  # a JVM starting on two busy cores
            "KAFKA_BROKER_JVM_FLAGS": self.jvm_flags,
        }
        if self.tenants is not None:
            env |= {"KAFKA_AUTH": "scram", "KAFKA_TENANTS": " ".join(self.tenants)}
        subprocess.run([str(REPO / "deploy/kafka/kafka.sh"), action], check=True, env=env, timeout=360)

    def start(self) -> None:
        self._script("start")

    def stop(self) -> None:
        self._script("stop")


@dataclass
class PrivateRedis:
    """A Redis of our own (append-only file, fsync every second, as deploy/redis/redis.sh runs it) that a
    test may stop, SIGKILL, or make refuse writes for a while. With `acl` (an ACL file's text,
    llmbus.security.redis_acls), its users are those and `password` is its `default` user's: the one
    `client()` and the script's own calls log in with."""

    run_dir: Path
    port: int = field(default_factory=free_port)
    acl: str | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def name(self) -> str:
        return f"redis-{self.port}"

    def _script(self, action: str) -> None:
        env = os.environ | {
            "REDIS_PORT": str(self.port),
            "REDIS_RUN_DIR": str(self.run_dir),
            "REDIS_NAME": self.name,
            "REDIS_APPENDONLY": "yes",
        }
        if self.acl is not None:
            acl_file = self.run_dir / f"{self.name}.acl"
            self.run_dir.mkdir(parents=True, exist_ok=True)
            acl_file.write_text(self.acl)
            acl_file.chmod(0o600)
            env |= {"REDIS_ACLFILE": str(acl_file)}
        if self.password is not None:
            env |= {"REDIS_PASSWORD": self.password}
        subprocess.run([str(REPO / "deploy/redis/redis.sh"), action], check=True, env=env, timeout=60)

    def start(self) -> None:
        self._script("start")

    def stop(self) -> None:
        """SHUTDOWN NOSAVE: the append-only file is flushed, nothing lost."""
        self._script("stop")

    def sigkill(self) -> None:
        """SIGKILL: what a crash or an OOM killer does; the last second of writes (not yet fsynced) may be lost."""
        pid = int((self.run_dir / f"{self.name}.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        (self.run_dir / f"{self.name}.pid").unlink(missing_ok=True)

    async def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, password=self.password)


async def refuse_writes(client: redis.Redis, how: str, unreachable_port: int | None = None) -> None:
    """Make a Redis refuse every write that needs memory (`oom`: maxmemory reached, noeviction) or every
    write (`readonly`: a replica of a primary that is not there, as a primary demoted by a failover is),
    keeping its data and its reads."""
    if how == "oom":
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")
    elif how == "readonly":
        await client.execute_command("REPLICAOF", "127.0.0.1", str(unreachable_port or free_port()))
    else:
        raise ValueError(f"refuse writes how? {how!r}")


async def take_writes(client: redis.Redis) -> None:
    await client.config_set("maxmemory", "0")
    await client.execute_command("REPLICAOF", "NO", "ONE")


@dataclass
class PrivateRedisCluster:
    """A Redis Cluster of our own that a test may fail over: three primaries, a replica each (Debian's
    redis-server in cluster mode, append-only file fsynced every second as deployed), a node timeout of
    `node_timeout_ms` (a replica takes over a primary silent that long)."""

    run_dir: Path
    node_timeout_ms: int = 2000
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.ports:
            self.ports = [cluster_port() for _ in range(6)]

    @property
    def url(self) -> str:
        """A node a client starts from (it finds the others): one never failed by `fail_primary`."""
        return f"redis://127.0.0.1:{self.ports[-1]}/0"

    def _cli(self, port: int, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout

    def _launch(self, port: int) -> None:
        node = self.run_dir / str(port)
        node.mkdir(parents=True, exist_ok=True)
        self.procs[port] = subprocess.Popen(
            [
                "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms), "--dir", str(node),
                "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                "--logfile", str(node / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def _wait(self, condition: object, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():  # type: ignore[operator]
                    return
            except (subprocess.SubprocessError, OSError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"redis cluster: {what} within {timeout_s:.0f} s (logs in {self.run_dir})")

    def start(self) -> None:
        for port in self.ports:
            self._launch(port)
        for port in self.ports:
            self._wait(lambda port=port: self._cli(port, "ping").strip() == "PONG", f"node {port} answering")
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        self._cli(self.ports[0], "--cluster", "create", *nodes, "--cluster-replicas", "1", "--cluster-yes")
        self._wait(self.healthy, "every slot served, a replica for each primary")

    def roles(self) -> dict[int, str]:
        """port → master or slave, as the cluster sees its live nodes."""
        out: dict[int, str] = {}
        for line in self._cli(self.ports[-1], "cluster", "nodes").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            if "fail" not in fields[2]:
                out[port] = "master" if "master" in fields[2] else "slave"
        return out

    def healthy(self) -> bool:
        roles = self.roles()
        ok = "cluster_state:ok" in self._cli(self.ports[-1], "cluster", "info")
        return ok and sum(r == "master" for r in roles.values()) == 3 and sum(r == "slave" for r in roles.values()) == 3

    def fail_primary(self) -> int:
        """SIGKILL a primary (not the node clients start from); returns once its replica serves its slots."""
        roles = self.roles()
        victim = next(port for port in self.ports[:-1] if roles.get(port) == "master")
        self.procs[victim].kill()
        self.procs[victim].wait(timeout=10)
        # roles() leaves out a node flagged failing: the victim drops out once the others agree it failed
        # (after the node timeout), and three primaries again means its replica took its slots over.
        self._wait(
            lambda: (
                victim not in (roles := self.roles())
                and sum(r == "master" for r in roles.values()) == 3
                and "cluster_state:ok" in self._cli(self.ports[-1], "cluster", "info")
            ),
            "a replica promoted",
        )
        return victim

    def restart(self, port: int) -> None:
        """The failed node started again on its data: it rejoins as the new primary's replica."""
        self._launch(port)
        self._wait(self.healthy, f"node {port} back as a replica")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10_000 > 65_535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10_000))
            except OSError:
                continue
        return port
