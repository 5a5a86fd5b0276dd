"""The reliability report: one row per scenario with its counts and the command that produced it."""

from __future__ import annotations

import json
from pathlib import Path

from llmbus.audit import AuditReport
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.report import write_report


def test_report_has_a_row_per_scenario_and_the_command(tmp_path: Path) -> None:
    clean = AuditReport(sent=10, answered=9, errored=1, error_results={"internal": 1}, errors_by_id={"r3": "internal"})
    doubled = AuditReport(sent=10, answered=9, doubled=1)
    doubled.note("doubled", "r7: 2 results")
    allowed = ErrorBudget().allow(("internal",), 1, "the fault", ["r3"])
    outcomes = [Outcome("a_fault", clean, 12.3, ["t+1.0s fault"], budget=allowed), Outcome("b_fault", doubled, 4.0)]
    write_report(outcomes, tmp_path / "reliability", "make reliability", "long")
    data = json.loads((tmp_path / "reliability.json").read_text())
    assert data["command"] == "make reliability" and [r["scenario"] for r in data["scenarios"]] == [
        "a_fault",
        "b_fault",
    ]
    assert data["scenarios"][1]["doubled"] == 1 and data["scenarios"][1]["passed"] is False
    md = (tmp_path / "reliability.md").read_text()
    assert "`make reliability`" in md
    assert "| a_fault | 10 | 9 | 1 | 0 | 0 | 0 | 0 | 0 | internal 1 | 12.3 | pass |" in md
    assert "| b_fault | 10 | 9 | 0 | 0 | 1 |" in md and "**FAIL**" in md and "r7: 2 results" in md
    assert "**a_fault**: internal <= 1 of 1 named requests: the fault" in md
    assert "**b_fault**: none: every request must be answered" in md
    assert (tmp_path / "reliability.png").stat().st_size > 0


def test_report_has_a_row_per_scenario_and_service_judged_by_its_own_check(tmp_path: Path) -> None:
    from llmbus_tools.harness.reliability.service_rows import service_rows

    scheduler_log = tmp_path / "scheduler.log"
    scheduler_log.write_text(
        "x WARNING aiokafka: Heartbeat failed: local member_id was not recognized; resetting\n"
        "x WARNING llmbus.bus.commits: commit failed for 10.0s (TimeoutError()): left for the next interval\n"
        "x WARNING llmbus.bus.producer: no ack yet from Kafka for llm.dispatch.w1; still waiting\n"
    )
    cost_log = tmp_path / "cost.log"
    cost_log.write_text("")
    logs = {"scheduler": scheduler_log, "cost": cost_log, "w1": tmp_path / "never-started.log"}
    rows = service_rows(logs, ["cost exited with -9; restarted"], True, {"Billing": False})
    by_service = {r["service"]: r for r in rows}
    assert by_service["scheduler"] == {
        "service": "scheduler",
        "judged_by": "delivery audit",
        "passed": True,
        "exits": 0,
        "memberships_lost": 1,
        "commits_left": 1,
        "acks_waited": 1,
        "sends_retried": 0,
        "producers_renewed": 0,
        "retried_in_place": 0,
        "placed_again": 0,
        "redis_refused": 0,
    }
    assert by_service["cost"]["judged_by"] == "Billing" and by_service["cost"]["passed"] is False
    assert by_service["cost"]["exits"] == 1 and by_service["w1"]["memberships_lost"] == 0

    outcome = Outcome("leader_sigkill", AuditReport(sent=1, answered=1), 1.0, services=rows)
    write_report([outcome], tmp_path / "cluster", "make reliability-cluster", "long")
    md = (tmp_path / "cluster.md").read_text()
    assert "| leader_sigkill | scheduler | delivery audit | pass | 0 | 1 | 1 | 1 | 0 | 0 | 0 | 0 | 0 |" in md
    assert "| leader_sigkill | cost | Billing | **FAIL** | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |" in md
    assert json.loads((tmp_path / "cluster.json").read_text())["scenarios"][0]["services"] == rows


def test_redis_refusing_a_service_a_command_fails_its_scenario(tmp_path: Path) -> None:
    """Under per-service Redis ACL users a command the user lacks fails, in a script or not; the router's rate
    limits then fail open, and the scenario would pass unless the log is judged."""
    from llmbus_tools.harness.reliability.service_rows import refusals, service_rows

    router_log = tmp_path / "router.log"
    router_log.write_text(
        "x WARNING llmbus_services.router.adapters.limits: rate limit check failed; letting rel-1 through\n"
        "redis.exceptions.ResponseError: The user executing the script can't run this command or subcommand\n"
        "redis.exceptions.NoPermissionError: NOPERM User router has no permissions to run the 'time' command\n"
    )
    rows = service_rows({"router": router_log}, [], True, {})
    assert rows[0]["redis_refused"] == 2 and rows[0]["passed"] is False
    assert refusals(rows) == ["router: Redis refused its ACL user 2 command(s) (see its log)"]
    assert refusals(service_rows({"w1": tmp_path / "none.log"}, [], True, {})) == []
