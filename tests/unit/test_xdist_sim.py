"""tests/xdist_sim.py: measured durations scheduled onto workers the way xdist hands out scopes."""

from __future__ import annotations

from pathlib import Path

from tests import xdist_sim


def test_durations_add_up_per_test_and_a_group_stays_on_one_worker(tmp_path: Path) -> None:
    report = tmp_path / "durations.txt"
    report.write_text(
        "=== slowest durations ===\n"
        "50.00s setup    tests/a.py::test_engine\n"
        "10.00s call     tests/a.py::test_engine\n"
        "1.50s teardown  tests/a.py::test_engine\n"
        "5.00s call     tests/b.py::test_one\n"
    )
    durations = xdist_sim.read_durations(report)
    assert durations == {"tests/a.py::test_engine": 61.5, "tests/b.py::test_one": 5.0}

    order = ["g1", "g2", "g3", "g4", "s1", "s2", "s3"]
    scopes = xdist_sim.scopes_in_order(order, {n: "engine" for n in ("g1", "g2", "g3", "g4")})
    assert list(scopes) == ["engine", "s1", "s2", "s3"]
    seconds = {"g1": 40.0, "g2": 1.0, "g3": 1.0, "g4": 1.0, "s1": 10.0, "s2": 10.0, "s3": 10.0}
    pool = xdist_sim.simulate(scopes, seconds, workers=2)
    engine_worker = next(w for w in pool if w.scopes[0][0] == "engine")
    other = next(w for w in pool if w is not engine_worker)
    # A worker takes scopes while two or fewer of its tests are pending: the engine's four tests are enough
    # for the first worker; the other takes s1, s2 and s3 at the start, so none is left for the first.
    assert [name for name, _ in engine_worker.scopes] == ["engine"]
    assert [name for name, _ in other.scopes] == ["s1", "s2", "s3"]
    assert (engine_worker.clock_s, other.clock_s) == (43.0, 30.0)
