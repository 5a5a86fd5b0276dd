"""The report's rows per scenario and service: which check judged the service, its verdict, and what
its log says it went through (group memberships lost, commits left for later, acks waited for), and
whether Redis refused it a command (its ACL user lacks one it runs: that fails the scenario)."""

from __future__ import annotations

from pathlib import Path

# What a service's log says when it rides out a broker fault, counted per service (aiokafka's and
# llmbus.bus's own warnings; each line counts once); and Redis refusing its user a command, in a script or not
# (no scenario injects that: a service that meets it fails open, or fails, where a deployment would too).
SIGNALS: dict[str, str | tuple[str, ...]] = {
    "memberships_lost": "local member_id was not recognized",
    "commits_left": "commit failed for",
    "acks_waited": "no ack yet from Kafka",
    "sends_retried": "sending it again",
    "producers_renewed": "starting a new producer",
    "retried_in_place": "): retrying in ",  # a transient failure (llmbus.bus.bindings)
    "placed_again": "again later",  # a placement that failed transiently (the scheduler)
    "redis_refused": ("NOPERM", "can't run this command", "WRONGPASS"),
}
# The services whose effect an effect checker judges (llmbus_tools.harness.reliability.effects); every other service
# is judged by the delivery audit of the request path.
JUDGED_BY = {"cost": "Billing", "comparator": "Comparing", "autoscaler": "Scaling"}
DELIVERY = "delivery audit"


def signals_in(log_text: str) -> dict[str, int]:
    lines = log_text.splitlines()
    return {name: sum(1 for line in lines if _says(line, marker)) for name, marker in SIGNALS.items()}


def _says(line: str, marker: str | tuple[str, ...]) -> bool:
    return any(m in line for m in ((marker,) if isinstance(marker, str) else marker))


def refusals(rows: list[dict[str, object]]) -> list[str]:
    """A problem per service whose log shows Redis refusing its user a command."""
    return [
        f"{row['service']}: Redis refused its ACL user {row['redis_refused']} command(s) (see its log)"
        for row in rows
        if row.get("redis_refused")
    ]


def judge_of(service: str) -> str:
    return next((effect for prefix, effect in JUDGED_BY.items() if service.startswith(prefix)), DELIVERY)


def service_rows(
    logs: dict[str, Path], crashes: list[str], delivery_passed: bool, effects_passed: dict[str, bool]
) -> list[dict[str, object]]:
    """One row per service: `logs` service → its log file, `crashes` the supervisor's notes
    ("<name> exited with …"), `effects_passed` effect class name → its check passed."""
    rows: list[dict[str, object]] = []
    for service, path in logs.items():
        judge = judge_of(service)
        passed = delivery_passed if judge == DELIVERY else effects_passed.get(judge, delivery_passed)
        text = path.read_text(errors="replace") if path.exists() else ""
        exits = sum(1 for c in crashes if c.startswith(f"{service} exited"))
        signals = signals_in(text)
        passed = passed and not signals["redis_refused"]
        rows.append({"service": service, "judged_by": judge, "passed": passed, "exits": exits, **signals})
    return rows
