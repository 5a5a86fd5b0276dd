"""Which tests must share one pytest-xdist worker, and a scheduler that keeps them together.

`make test` runs the suite on several xdist workers (`-n N --dist loadgroup`). Tests that share
one expensive session or module resource run on one worker, so it is built once:

- every test that uses the `vllm_engine` fixture (one vLLM engine per run), and the vllm-marked
  tests of its modules (they import vLLM: cheap where the engine runs),
- every test that uses the `vllm_chatml_engine` fixture (the second session engine), in a group of
  its own: its build runs on another worker beside the first engine's chain, and once per run (a
  test of it outside every group was handed to whichever worker was free, and built it again there),
- every test that uses the `vllm_llama31_engine` fixture (the third, Llama 3.1's), likewise,
- every test that uses the `secured_kafka` fixture (one private secured broker per run),
- every test that uses the `redis_cluster` fixture (one private 3-master Redis Cluster per run),
- all tests of a module that has a module-scoped fixture (a stack of services, a private Redis),
- tests marked `xdist_group("name")` by hand, by that name.

To add a session resource that is expensive to build (an engine, a private broker): name its fixture
and its group in SHARED_BY_FIXTURE, and, if it is a vLLM engine, its group in VLLM_GROUPS too (those
groups start first). A new test that uses an existing fixture needs nothing: it joins the group.

pytest-xdist's own loadgroup scheduler names a group by appending "@name" to the node id, which
pytest 9 no longer lets a plugin do (`Node.nodeid` is computed from a structured id), so every test
would land wherever. Instead each worker writes its test → group table to a directory the
controller names (LLMBUS_XDIST_GROUPS_DIR), and the controller's scheduler reads it once all
workers have collected (they collect the same tests), before it hands out any work. The workers
also order their tests slowest first (the vLLM group, then tests marked slow), which is the order
the controller hands them out in.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS_DIR_ENV = "LLMBUS_XDIST_GROUPS_DIR"
SHARED_BY_FIXTURE = {
    "vllm_engine": "vllm",
    "vllm_chatml_engine": "vllm-chatml",
    "vllm_llama31_engine": "vllm-llama31",
    "secured_kafka": "secured-kafka",
    "redis_cluster": "redis-cluster",
}
# Groups that build a vLLM engine: the longest chains (a cold start of a minute or more on 2 cores each).
VLLM_GROUPS = frozenset({"vllm", "vllm-chatml", "vllm-llama31"})


def group_of(item: pytest.Item) -> str | None:
    """The group `item` must run in, None if it may run on any worker."""
    named = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    )
    if named:
        return "_".join(named)
    fixtures = set(getattr(item, "fixturenames", ()))
    for fixture, group in SHARED_BY_FIXTURE.items():
        if fixture in fixtures:
            return group
    # A module-scoped fixture is built once per worker that runs one of the module's tests.
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs):
        return _module_of(item.nodeid)
    return None


def _module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def name_groups_dir(config: pytest.Config) -> None:
    """In the controller of an xdist run: the directory the workers write their tables to."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    os.environ[GROUPS_DIR_ENV] = tempfile.mkdtemp(prefix="llmbus-xdist-groups-")


def remove_groups_dir(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or not (directory := os.environ.get(GROUPS_DIR_ENV)):
        return
    shutil.rmtree(directory, ignore_errors=True)


def start_rank(item: pytest.Item, group: str | None) -> int:
    """When to hand a test out: the vLLM engines' groups (the longest chains) first, then tests marked slow
    and the secured broker's group, then the other groups, then the rest, which fill the gaps. Handed out
    in suite order, a slow test near the end of the suite (tests/reliability) would start last and finish
    minutes after everything else."""
    if group in VLLM_GROUPS:
        return 0
    if item.get_closest_marker("slow") is not None or group in SHARED_BY_FIXTURE.values():
        return 1  # the secured broker's group: a JVM to start before its first test
    return 2 if group is not None else 3


def write_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker: order the tests slowest first and write this worker's table of grouped tests, whole
    (rename), for the controller. Every worker orders the same way, so their collections stay identical."""
    workerinput = getattr(config, "workerinput", None)
    directory = os.environ.get(GROUPS_DIR_ENV)
    if workerinput is None or not directory:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item)) is not None}
    join_engine_groups(items, groups)
    items.sort(key=lambda item: start_rank(item, groups.get(item.nodeid)))  # stable: a group keeps its order
    target = Path(directory) / f"{workerinput['workerid']}.json"
    partial = target.with_suffix(".partial")
    partial.write_text(json.dumps(groups))
    partial.replace(target)


def join_engine_groups(items: list[pytest.Item], groups: dict[str, str]) -> None:
    """A vllm-marked test outside every group, beside an engine's users (test_error_classification),
    imports vLLM and torch: ~5-40 s on a worker that has not, nothing on one that runs that engine, so it
    joins that engine's group (the first engine's where its module uses both)."""
    engine_of_module: dict[str, str] = {}
    for nodeid, group in groups.items():
        if group in VLLM_GROUPS:
            module = _module_of(nodeid)
            if engine_of_module.get(module) != SHARED_BY_FIXTURE["vllm_engine"]:
                engine_of_module[module] = group
    for item in items:
        if item.get_closest_marker("vllm") is not None and (engine := engine_of_module.get(_module_of(item.nodeid))):
            groups.setdefault(item.nodeid, engine)


class SharedResourceScheduling(LoadScopeScheduling):
    """xdist's loadscope scheduling with a scope per group (a test outside every group is its own scope).

    Scopes go out in the order the workers collected them (write_groups put the slow ones first),
    not largest first: a group of many fast tests is no reason to start early.
    """

    def __init__(self, config: pytest.Config, log: object | None = None) -> None:
        config.option.loadscopereorder = False
        super().__init__(config, log)  # type: ignore[arg-type]
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            self._groups = self._read_groups()
        return self._groups.get(nodeid, nodeid)

    @staticmethod
    def _read_groups() -> dict[str, str]:
        directory = os.environ.get(GROUPS_DIR_ENV)
        tables = sorted(Path(directory).glob("*.json")) if directory else []
        if not tables:
            raise RuntimeError(f"no xdist group table in {directory!r}: the workers did not write one")
        return dict(json.loads(tables[0].read_text()))
