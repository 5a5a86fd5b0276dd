"""The reliability report: one row per scenario with its counts and the command that produced it."""

from __future__ import annotations

import json
from pathlib import Path

from llmbus.audit import AuditReport
from tests.reliability.harness import Outcome
from tests.reliability.report import write_report


def test_report_has_a_row_per_scenario_and_the_command(tmp_path: Path) -> None:
    clean = AuditReport(sent=10, answered=10, ok_results=10)
    doubled = AuditReport(sent=10, answered=9, doubled=1, ok_results=9)
    doubled.note("doubled", "r7: 2 results")
    outcomes = [Outcome("a_fault", clean, 12.3, ["t+1.0s fault"]), Outcome("b_fault", doubled, 4.0)]
    write_report(outcomes, tmp_path / "reliability", "make reliability", "long")
    data = json.loads((tmp_path / "reliability.json").read_text())
    assert data["command"] == "make reliability" and [r["scenario"] for r in data["scenarios"]] == [
        "a_fault",
        "b_fault",
    ]
    assert data["scenarios"][1]["doubled"] == 1 and data["scenarios"][1]["passed"] is False
    md = (tmp_path / "reliability.md").read_text()
    assert "`make reliability`" in md
    assert "| a_fault | 10 | 10 | 0 | 0 | 0 | 0 | 0 | 10 / none | 12.3 | pass |" in md
    assert "| b_fault | 10 | 9 | 0 | 1 |" in md and "**FAIL**" in md and "r7: 2 results" in md
