"""tests/xdist_groups.py: which tests share an xdist worker, and which go out first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests import xdist_groups


@dataclass
class _Item:
    """The parts of a pytest.Item that the grouping reads."""

    nodeid: str
    fixturenames: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    _fixtureinfo: Any = None
    marks: list[pytest.Mark] = field(default_factory=list)

    def iter_markers(self, name: str) -> list[pytest.Mark]:
        return [m for m in self.marks if m.name == name]

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def _groups(items: list[_Item]) -> dict[str, str]:
    groups = {i.nodeid: g for i in items if (g := xdist_groups.group_of(i)) is not None}  # type: ignore[arg-type]
    xdist_groups.join_engine_groups(items, groups)  # type: ignore[arg-type]
    return groups


def test_each_vllm_engine_has_one_group_and_its_modules_vllm_tests_join_it() -> None:
    items = [
        _Item("a.py::llama", ("vllm_engine",), ("vllm",)),
        _Item("a.py::chatml", ("vllm_chatml_engine",), ("vllm",)),
        _Item("a.py::imports_vllm", (), ("vllm",)),
        _Item("b.py::preempt", ("vllm_chatml_engine",), ("vllm",)),
        _Item("b.py::warmup_plan", ("vllm_chatml_engine",), ("vllm",)),
        _Item("b.py::imports_vllm", (), ("vllm",)),
        _Item("c.py::no_engine", (), ("vllm",)),
        _Item("c.py::plain"),
    ]
    groups = _groups(items)
    # The second engine's users share one group wherever they are: it is built once per run.
    assert groups["b.py::preempt"] == groups["b.py::warmup_plan"] == groups["a.py::chatml"] == "vllm-chatml"
    assert groups["a.py::llama"] == "vllm"
    assert groups["a.py::imports_vllm"] == "vllm"  # beside both engines: the first one's
    assert groups["b.py::imports_vllm"] == "vllm-chatml"
    assert "c.py::no_engine" not in groups and "c.py::plain" not in groups
    third = _Item("e.py::bos", ("vllm_llama31_engine",), ("vllm",))
    assert xdist_groups.group_of(third) == "vllm-llama31"  # type: ignore[arg-type]
    assert xdist_groups.start_rank(third, "vllm-llama31") == 0  # type: ignore[arg-type]


def test_both_vllm_groups_go_out_before_slow_tests_and_other_groups() -> None:
    slow = _Item("d.py::slow", markers=("slow",))
    plain = _Item("d.py::plain")
    ranks = {
        "vllm": xdist_groups.start_rank(plain, "vllm"),  # type: ignore[arg-type]
        "vllm-chatml": xdist_groups.start_rank(plain, "vllm-chatml"),  # type: ignore[arg-type]
        "slow": xdist_groups.start_rank(slow, None),  # type: ignore[arg-type]
        "module": xdist_groups.start_rank(plain, "d.py"),  # type: ignore[arg-type]
        "rest": xdist_groups.start_rank(plain, None),  # type: ignore[arg-type]
    }
    assert ranks["vllm"] == ranks["vllm-chatml"] < ranks["slow"] < ranks["module"] < ranks["rest"]
