"""How a fault scenario is judged: the delivery audit, the error results it allowed before it ran (each
code with its reason and its bound), the exactly-once effects of the services beside the request path,
and the Outcome the report is written from.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from llmbus.audit import AuditReport, audit, read_namespace
from llmbus.settings import BusSettings
from llmbus_tools.harness.reliability.effects import Effect
from llmbus_tools.harness.reliability.load import Answers
from llmbus_tools.harness.reliability.service_rows import refusals, service_rows
from llmbus_tools.harness.reliability.stack import Stack
from llmbus_tools.harness.service_procs import drop_namespace

QUIESCED = ("cost", "comparator")  # stopped before the audit reads the namespace and their Redis


@dataclass(frozen=True)
class Allowed:
    """Error results a scenario allows, fixed before it runs: with one of `codes`, at most `at_most` of
    them together, only for `ids` (None: any request), because `why`."""

    codes: tuple[str, ...]
    at_most: int
    why: str
    ids: frozenset[str] | None = None

    def covers(self, request_id: str, code: str) -> bool:
        return code in self.codes and (self.ids is None or request_id in self.ids)

    def describe(self) -> str:
        whose = "" if self.ids is None else f" of {len(self.ids)} named requests"
        return f"{'/'.join(self.codes)} <= {self.at_most}{whose}: {self.why}"


@dataclass
class ErrorBudget:
    """Every error result must be covered by one allowance (the first that covers it), and no allowance may
    cover more than its bound. Empty: no error result at all (nothing a client needs was down)."""

    allowed: list[Allowed] = field(default_factory=list)

    def allow(self, codes: Iterable[str], at_most: int, why: str, ids: Iterable[str] | None = None) -> ErrorBudget:
        self.allowed.append(Allowed(tuple(codes), at_most, why, frozenset(ids) if ids is not None else None))
        return self

    def problems(self, report: AuditReport) -> list[str]:
        used = [0] * len(self.allowed)
        unjustified: dict[str, list[str]] = {}
        for request_id, code in sorted(report.errors_by_id.items()):
            index = next((i for i, a in enumerate(self.allowed) if a.covers(request_id, code)), None)
            if index is None:
                unjustified.setdefault(code, []).append(request_id)
            else:
                used[index] += 1
        out = [
            f"{len(ids)} {code} error results no allowance covers, e.g. {ids[:3]}" for code, ids in unjustified.items()
        ]
        out += [
            f"{n} error results under '{a.describe()}'"
            for n, a in zip(used, self.allowed, strict=True)
            if n > a.at_most
        ]
        return out

    def describe(self) -> list[str]:
        return [a.describe() for a in self.allowed] or ["none: every request must be answered"]


@dataclass
class Outcome:
    """A scenario's verdict: the audit, the error budget fixed before the run, the effects' checks, plus
    what the harness saw (for the report)."""

    scenario: str
    report: AuditReport
    seconds: float
    notes: list[str] = field(default_factory=list)
    error: str | None = None  # the scenario itself did not complete (the audit did not run)
    budget: ErrorBudget = field(default_factory=ErrorBudget)
    effect_problems: list[str] = field(default_factory=list)  # downstream effects not exactly once
    services: list[dict[str, object]] = field(default_factory=list)  # llmbus_tools.harness.reliability.service_rows

    @property
    def errors_over_budget(self) -> list[str]:
        return self.budget.problems(self.report)

    @property
    def passed(self) -> bool:
        return self.error is None and self.report.passed and not self.errors_over_budget and not self.effect_problems

    def verdict(self) -> str:
        lines = [self.report.summary()]
        lines += [f"  errors beyond what the scenario allowed: {p}" for p in self.errors_over_budget]
        lines += [f"  effect: {p}" for p in self.effect_problems]
        return "\n".join(lines)

    def row(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            **self.report.counts(),
            "error_results": self.report.error_results,
            "errors_allowed": self.budget.describe(),
            "errors_over_budget": self.errors_over_budget,
            "effect_problems": self.effect_problems,
            "dead_letters": self.report.dead_letters,
            "dead_letters_by": self.report.dead_letters_by,
            "chunk_redeliveries": self.report.chunk_redeliveries,
            "seconds": round(self.seconds, 1),
            "passed": self.passed,
            "error": self.error,
            "notes": self.notes,
            "problems": self.report.problems,
            "services": self.services,
        }


async def dispose(settings: BusSettings) -> None:
    """Drop the namespace, unless LLMBUS_RELIABILITY_KEEP=1 (then `llmbus audit --prefix` can look at it)."""
    if os.environ.get("LLMBUS_RELIABILITY_KEEP") == "1":
        print(f"kept namespace {settings.topic_prefix} on {settings.kafka_bootstrap}", file=sys.stderr)
        return
    await drop_namespace(settings)


async def finish(
    scenario: str,
    stack: Stack,
    answers: Answers,
    sent_ids: list[str],
    started: float,
    *,
    answer_timeout_s: float,
    budget: ErrorBudget,
    account_requests: bool = False,
    notes: list[str] | None = None,
    effects: list[Effect] | None = None,
    planted: Iterable[tuple[str, int, int]] = (),
) -> Outcome:
    """Wait for the answers (and the effects to settle), then audit everything the namespace holds and
    judge the error results against `budget` and each effect's check. `planted`: (topic, partition,
    offset) of records the scenario wrote on purpose where they do not belong (undecodable ones): left
    out of the delivery audit, the scenario judges what became of them."""
    load_done = time.monotonic()
    answered = await answers.wait(sent_ids, answer_timeout_s)
    notes = list(notes or [])
    notes.append(f"load sent in {load_done - started:.1f}s; answers awaited {time.monotonic() - load_done:.1f}s")
    for effect in effects or []:
        await effect.settle(answers.seen & set(sent_ids), answer_timeout_s)
    # What bills and counts stops first (SIGTERM: it finishes what it holds): its topics and its Redis
    # totals are then read as one state, not a record published between the two reads.
    for name in [n for n in stack.procs if n.startswith(QUIESCED)]:
        await asyncio.to_thread(stack.retire, name)
    if stack.crashes:
        notes.append(f"services that exited by themselves ({len(stack.crashes)}): {stack.crashes[:10]}")
    notes.append(f"{answered}/{len(sent_ids)} with a result within {answer_timeout_s:.0f}s of the last send")
    reader = stack.deployment.operator
    skipped = set(planted)
    records = [r for r in await read_namespace(reader) if (r.topic, r.partition, r.offset) not in skipped]
    report = audit(stack.deployment.topics, records, sent_ids, account_requests=account_requests)
    effect_problems: list[str] = []
    effects_passed: dict[str, bool] = {}
    for effect in effects or []:
        problems, effect_notes = await effect.check(records)
        effect_problems += problems
        effects_passed[type(effect).__name__] = not problems
        notes += effect_notes
    notes.append(f"error results {report.error_results or 'none'}; allowed (fixed before the run): {budget.describe()}")
    outcome = Outcome(
        scenario, report, time.monotonic() - started, notes, budget=budget, effect_problems=effect_problems
    )
    logs = {name: proc.log_path for name, proc in stack.procs.items()}
    delivery_passed = report.passed and not outcome.errors_over_budget
    outcome.services = service_rows(logs, stack.crashes, delivery_passed, effects_passed)
    outcome.effect_problems += refusals(outcome.services)
    print(f"{scenario}: {outcome.verdict()}\n  " + "\n  ".join(notes), file=sys.stderr)
    return outcome
