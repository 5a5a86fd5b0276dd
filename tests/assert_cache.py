"""The rewritten test modules cached once, by the xdist controller, before its workers collect.

pytest rewrites each test module's asserts at import and caches the result beside it (a checked-hash
pyc in `__pycache__`, valid for the source's content, not its mtime). On a fresh clone there is no
cache yet, so each of `make test`'s workers rewrites every module again while it collects: about
7 CPU-seconds per worker on two cores. The controller writes the cache first, with pytest's own
functions, so each module is rewritten once and every worker reads it.

Best effort: nothing is done where bytecode is not written or asserts are not rewritten, and a pytest
whose internals differ leaves the workers to rewrite as before.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _rewritten_modules() -> list[Path]:
    """The modules pytest rewrites here: test modules, conftests and the fixtures plugins they load."""
    return sorted({*TESTS.rglob("test_*.py"), *TESTS.rglob("conftest.py"), *(TESTS / "fixtures").glob("*.py")})


def prewarm(config: pytest.Config, modules: list[Path] | None = None) -> int:
    """Write the cached rewrite of every module (default: this suite's) whose cache is missing or stale;
    return how many were written."""
    if sys.dont_write_bytecode or config.getoption("assertmode", "rewrite") != "rewrite":
        return 0
    try:
        from _pytest.assertion import rewrite

        read_pyc, rewrite_test, write_pyc = rewrite._read_pyc, rewrite._rewrite_test, rewrite._write_pyc
        cache_dir_of, pyc_tail, makedirs = rewrite.get_cache_dir, rewrite.PYC_TAIL, rewrite.try_makedirs
        state = config.stash.get(rewrite.assertstate_key, None)
    except (ImportError, AttributeError):  # another pytest's internals: its workers rewrite as before
        return 0
    if state is None:
        return 0
    written = 0
    for module in _rewritten_modules() if modules is None else modules:
        cache_dir = cache_dir_of(module)
        pyc = cache_dir / (module.name[:-3] + pyc_tail)
        if read_pyc(module, pyc) is not None or not makedirs(cache_dir):
            continue
        source_hash, code = rewrite_test(module, config)
        written += write_pyc(state, code, source_hash, pyc)
    return written
