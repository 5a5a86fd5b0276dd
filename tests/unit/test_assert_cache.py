"""tests/assert_cache.py: the controller's cached rewrite is the one pytest's import reads, with its
assert introspection, and a module whose cache is current is not rewritten again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _pytest.assertion import rewrite

from tests import assert_cache

pytestmark = pytest.mark.skipif(sys.dont_write_bytecode, reason="no bytecode is written (PYTHONDONTWRITEBYTECODE)")


def test_a_module_is_rewritten_once_and_read_back_with_its_introspection(
    tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    module = tmp_path / "test_sample.py"
    module.write_text("def check(x):\n    assert x == 2\n")
    assert assert_cache.prewarm(pytestconfig, [module]) == 1
    pyc = rewrite.get_cache_dir(module) / ("test_sample" + rewrite.PYC_TAIL)
    code = rewrite._read_pyc(module, pyc)
    assert code is not None  # what a worker's import finds: no second rewrite
    namespace: dict[str, object] = {}
    exec(code, namespace)
    with pytest.raises(AssertionError, match=r"assert 1 == 2"):  # a plain assert says nothing
        namespace["check"](1)  # type: ignore[operator]
    assert assert_cache.prewarm(pytestconfig, [module]) == 0
    module.write_text("def check(x):\n    assert x == 3\n")  # changed: its cache is stale
    assert assert_cache.prewarm(pytestconfig, [module]) == 1


def test_the_suites_modules_include_its_conftests_and_fixtures() -> None:
    names = {p.relative_to(assert_cache.TESTS).as_posix() for p in assert_cache._rewritten_modules()}
    assert {"conftest.py", "fixtures/vllm_engine.py", "unit/test_assert_cache.py"} <= names
