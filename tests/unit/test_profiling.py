"""llmbus.observability.profiling: a CPU-time profile is written at exit when asked for, nothing otherwise."""

from __future__ import annotations

import pstats
from pathlib import Path

from llmbus.observability.profiling import cpu_profiled


def _spin(n: int) -> int:
    return sum(i * i for i in range(n))


def test_the_profile_names_where_cpu_went(tmp_path: Path) -> None:
    with cpu_profiled(str(tmp_path / "out"), "svc"):
        _spin(200_000)
    [path] = (tmp_path / "out").glob("svc-*.pstat")
    stats = pstats.Stats(str(path))
    spent = {name: entry[3] for (_, _, name), entry in stats.stats.items()}  # type: ignore[attr-defined]
    assert spent.get("_spin", 0) > 0


def test_no_path_no_profile(tmp_path: Path) -> None:
    with cpu_profiled(None, "svc"):
        _spin(1000)
    assert not list(tmp_path.iterdir())
