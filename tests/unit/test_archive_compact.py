"""Compaction of the archive (llmbus.archive.compact): one file per closed directory, each record id once,
and a crash at any step leaves every record there, once after the next start."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from llmbus.archive import read
from llmbus.archive.compact import (
    COMPACTIONS,
    CompactionBusy,
    closed_directories,
    compact,
    compaction_lock,
)
from llmbus.archive.layout import DATA_SUFFIX, TMP_SUFFIX
from llmbus.archive.rows import KINDS_BY_NAME, Source, row_of
from llmbus.cli.main import app
from llmbus_services.archive.adapters.store import ArchiveStore
from llmbus_services.archive.core.plan import plan_batch
from tests.unit.test_archive import DAY_MS, no_ids, result, result_rows

DIRECTORY = PurePath("results/day=2025-12-01/tenant=acme")
NEXT_DAY = "2025-12-02"
IDS = [f"r{n}" for n in range(12)]


class Crash(BaseException):
    """A SIGKILL, as far as the files are concerned: the step it hits and every later one never happen."""


def archive_of_small_batches(root: Path, ids: list[str] = IDS, batch: int = 3) -> ArchiveStore:
    store = ArchiveStore(root)
    for first in range(0, len(ids), batch):
        offsets = list(range(first, min(first + batch, len(ids))))
        store.write(plan_batch("llm.results", 0, result_rows(ids[first : first + batch], first), offsets, [], no_ids))
    return store


def data_files(root: Path, directory: PurePath = DIRECTORY) -> list[Path]:
    return sorted((root / directory).glob(f"*{DATA_SUFFIX}"))


def raw_ids(root: Path, directory: PurePath = DIRECTORY) -> list[str]:
    """Every row's id as a reader that does not dedupe sees them (DuckDB over the files)."""
    return [rid for path in data_files(root, directory) for rid in pq.read_table(path).column("record_id").to_pylist()]


def expected_ids(ids: list[str] = IDS) -> list[str]:
    return sorted(f"acme/{i}" for i in ids)


def test_a_closed_directory_becomes_one_file_with_the_same_records(tmp_path: Path) -> None:
    archive_of_small_batches(tmp_path)
    before = read.read_rows(tmp_path, "results")
    assert len(data_files(tmp_path)) == 4
    [done] = compact(tmp_path, NEXT_DAY)
    assert (done.directory, done.files_in, done.rows_in, done.rows_out) == (DIRECTORY, 4, 12, 12)
    assert len(data_files(tmp_path)) == 1 and sorted(raw_ids(tmp_path)) == expected_ids()
    assert read.read_rows(tmp_path, "results") == before  # same rows, payloads, source offsets
    assert not list((tmp_path / COMPACTIONS).glob("*.json"))
    assert compact(tmp_path, NEXT_DAY) == []  # one file left: nothing to do


def test_rows_written_twice_are_written_once(tmp_path: Path) -> None:
    store = archive_of_small_batches(tmp_path, IDS[:2])
    # A rebalanced partition's resend that the id cache of another process did not know.
    store.write(plan_batch("llm.results", 1, result_rows(IDS[:1]), [0], [], no_ids))
    assert sorted(raw_ids(tmp_path)) == ["acme/r0", "acme/r0", "acme/r1"]
    [done] = compact(tmp_path, NEXT_DAY)
    assert (done.rows_in, done.rows_out) == (3, 2)
    [row] = [r for r in pq.read_table(data_files(tmp_path)[0]).to_pylist() if r["record_id"] == "acme/r0"]
    assert (row["partition"], row["offset"]) == (0, 0)  # the first by source offset is kept


def test_only_closed_days_with_several_files_are_compacted(tmp_path: Path) -> None:
    archive_of_small_batches(tmp_path)
    store = ArchiveStore(tmp_path)
    later = [row_of(KINDS_BY_NAME["results"], result("x", at_ms=DAY_MS + 86_400_000), Source("llm.results", 0, 100, 0))]
    store.write(plan_batch("llm.results", 0, later, [100], [], no_ids))  # a day that is not over yet
    assert closed_directories(tmp_path, NEXT_DAY) == [DIRECTORY]
    assert closed_directories(tmp_path, "2025-12-01") == []
    assert closed_directories(tmp_path, NEXT_DAY, min_files=5) == []


def mutations() -> list[tuple[Any, str]]:
    """The file steps compaction and recovery take (each fsync, rename and removal)."""
    return [(os, "fsync"), (os, "replace"), (Path, "unlink")]


def crash_at(monkeypatch: pytest.MonkeyPatch, step: int) -> Callable[[], int]:
    """Raise Crash at the `step`-th file step from now; returns how many steps were taken."""
    taken = [0]
    for owner, name in mutations():
        original = getattr(owner, name)

        def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            taken[0] += 1
            if taken[0] == step:
                raise Crash
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return lambda: taken[0]


def test_a_crash_at_any_step_loses_nothing_and_the_next_start_leaves_each_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    template = tmp_path / "template"
    archive_of_small_batches(template)
    with monkeypatch.context() as patch:
        steps = crash_at(patch, 0)  # step 0 never comes: count a whole run's steps
        shutil.copytree(template, tmp_path / "count")
        compact(tmp_path / "count", NEXT_DAY)
        total = steps()
    assert total >= 8  # output fsync, journal fsync + rename + dir fsync, rename, 4 removals, ...
    for step in range(1, total + 1):
        root = tmp_path / f"crash-{step}"
        shutil.copytree(template, root)
        with monkeypatch.context() as patch:
            crash_at(patch, step)
            with pytest.raises(Crash):
                compact(root, NEXT_DAY)
        assert set(raw_ids(root)) == set(expected_ids()), f"a record missing after a crash at step {step}"
        ArchiveStore(root).recover(orphan_age_s=0)  # the archive's next start
        assert sorted(raw_ids(root)) == expected_ids(), f"not each record once after a crash at step {step}"
        assert not list(root.rglob(f"*{TMP_SUFFIX}")) and not list((root / COMPACTIONS).glob("*.json"))
        compact(root, NEXT_DAY)  # and the next compaction ends with one file
        assert len(data_files(root)) == 1 and sorted(raw_ids(root)) == expected_ids()


def test_the_archive_start_leaves_a_running_compactions_output_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive_of_small_batches(tmp_path)
    with monkeypatch.context() as patch:
        # Just after the journal's commit, before the output's rename: output fsync, journal fsync,
        # rename, directory fsync are steps 1-4.
        crash_at(patch, 5)
        with pytest.raises(Crash):
            compact(tmp_path, NEXT_DAY)
    [output_tmp] = list((tmp_path / DIRECTORY).glob(f"*{DATA_SUFFIX}{TMP_SUFFIX}"))
    with compaction_lock(tmp_path):  # as if that compaction were still running
        ArchiveStore(tmp_path).recover(orphan_age_s=0)
        assert output_tmp.exists()  # journaled: not an orphan
        with pytest.raises(CompactionBusy):
            compact(tmp_path, NEXT_DAY)
    ArchiveStore(tmp_path).recover(orphan_age_s=0)
    assert sorted(raw_ids(tmp_path)) == expected_ids() and not output_tmp.exists()


def test_the_cli_compacts_closed_days(tmp_path: Path) -> None:
    archive_of_small_batches(tmp_path)
    run = CliRunner().invoke(app, ["archive", "compact", "--archive", str(tmp_path), "--before", NEXT_DAY])
    assert run.exit_code == 0, run.output
    assert "4 files, 12 rows → 1 file, 12 rows" in run.output and "1 directories compacted" in run.output
    assert len(data_files(tmp_path)) == 1
