"""One cache root for every local file llmbus keeps: run files, the archive, test models."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmbus.archive.layout import default_root
from llmbus.process.detached import run_dir
from llmbus.settings import cache_root
from llmbus_tools.harness.tiny_llama import default_cache_dir


def test_llmbus_cache_moves_every_local_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLMBUS_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert run_dir() == tmp_path / "run"
    assert default_root() == tmp_path / "archive"
    assert default_cache_dir().parent == tmp_path


def test_without_llmbus_cache_it_is_under_the_home_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LLMBUS_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "llmbus"
    assert run_dir() == tmp_path / ".cache" / "llmbus" / "run"
