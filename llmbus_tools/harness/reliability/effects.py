"""Exactly-once effects of the services beside the request path, checked after a fault scenario.

The delivery audit (`llmbus.audit.check`) asks whether every request got exactly one result.
These checkers ask what the downstream services made of those results. Billing, after every
scenario: every result (shadow copies too) priced by exactly one record on llm.costs
(`llmbus.audit.bills.check_bills`: a record id twice is doubled even when the copies are identical),
and the money conserved: the sum of every distinct record's cost equals cost-accounting's Redis
totals overall, per model and per tenant (with the tenant's request count), so a doubled or
missing increment fails even when the stream is clean. Each effect has a `settle` (wait, with a
deadline, until it can be judged) and a `check` over the records the audit read (problems, notes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from llmbus.audit import Seen
from llmbus.audit.bills import check_bills
from llmbus.bus import decode
from llmbus.bus.admin import open_admin
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import BookedTo, Comparison, CostRecord, InferenceResult, Leg, ScaleDecision
from llmbus.contract.request_key import request_key
from llmbus.settings import BusSettings
from llmbus.state.keys import cost_key_root
from llmbus.state.store import redis_client
from llmbus.state.text import text_of
from llmbus_services.shadow_comparator.adapters.store import ComparatorStore


class Effect(Protocol):
    async def settle(self, result_ids: set[str], timeout_s: float) -> None: ...

    async def check(self, records: list[Seen]) -> tuple[list[str], list[str]]: ...


async def group_members(settings: BusSettings, group: str) -> set[str]:
    """Member ids of a Stable consumer group (none while it rebalances or does not exist). A
    SIGKILLed member stays listed until its session times out; a restarted process has a new id."""
    async with open_admin(settings) as admin:
        [described] = await asyncio.wait_for(admin.describe_consumer_groups([group]), settings.admin_timeout_s)
    _, _, state, _, _, members = described.groups[0][:6]
    return {str(member[0]) for member in members} if state == "Stable" else set()


def results_in(topics: t.Topics, records: Iterable[Seen], shadows: bool = False, keys: bool = False) -> set[str]:
    """Request ids with a result on llm.results (the results to bill; a shadow copy's too with `shadows`;
    request keys, tenant and id, with `keys`)."""
    name = topics.name(t.RESULTS)
    out = set()
    for record in records:
        if record.topic == name and record.value is not None:
            result = InferenceResult.model_validate_json(record.value)
            if shadows or not result.shadow:
                out.add(result.request_key if keys else result.request_id)
    return out


def legs_in(topics: t.Topics, records: Iterable[Seen]) -> dict[str, list[Leg]]:
    """Request key -> the legs of its non-shadow result, for the continued answers (more than one leg)."""
    name = topics.name(t.RESULTS)
    out: dict[str, list[Leg]] = {}
    for record in records:
        if record.topic == name and record.value is not None:
            result = InferenceResult.model_validate_json(record.value)
            if not result.shadow and result.legs:
                out[result.request_key] = result.legs
    return out


def leg_bill_problems(legs: dict[str, list[Leg]], costs: list[CostRecord]) -> list[str]:
    """Each leg of a continued answer billed by a record of its own, with the leg's worker and tokens: the
    answer's bill is then the sum of its legs', none billed twice (doubles are check_bills's)."""
    by_leg: dict[tuple[str, int | None], CostRecord] = {(request_key(c.tenant, c.request_id), c.leg): c for c in costs}
    problems = []
    for key, its_legs in sorted(legs.items()):
        last = len(its_legs) - 1
        for i, leg in enumerate(its_legs):
            record = by_leg.get((key, None if i == last else i))
            if record is None:
                problems.append(f"{key}: leg {i} has no cost record")
            elif (record.worker_id, record.completion_tokens) != (leg.worker_id, leg.completion_tokens):
                billed = (record.worker_id, record.completion_tokens)
                problems.append(f"{key}: leg {i} billed as {billed}, ran as {(leg.worker_id, leg.completion_tokens)}")
    return problems[:10]


def costs_in(topics: t.Topics, records: Iterable[Seen]) -> list[CostRecord]:
    name = topics.name(t.COSTS)
    return [CostRecord.model_validate_json(r.value) for r in records if r.topic == name and r.value is not None]


def tenant_totals_of(records: Iterable[CostRecord]) -> dict[str, tuple[int, int]]:
    """tenant -> (µUSD, requests) over distinct record ids booked to a tenant: what Redis must hold (a
    continued answer's earlier legs add their cost, not a request)."""
    distinct = {r.record_id: r for r in records if r.booked_to == BookedTo.TENANT}
    cost, requests = Counter[str](), Counter[str]()
    for record in distinct.values():
        cost[record.tenant] += record.cost_micro_usd
        requests[record.tenant] += record.leg is None
    return {tenant: (cost[tenant], requests[tenant]) for tenant in requests}


def cost_by(records: Iterable[CostRecord], dimension: str) -> dict[str, int]:
    """µUSD over distinct record ids per `model`, or overall (`total`: one value, "all")."""
    distinct = {r.record_id: r for r in records}
    out = Counter[str]()
    for record in distinct.values():
        out[(record.model or "-") if dimension == "model" else "all"] += record.cost_micro_usd
    return {key: n for key, n in out.items() if n}


def totals_problems(stream: dict[str, tuple[int, int]], counted: dict[str, tuple[int, int]]) -> list[str]:
    """Per tenant, the stream's distinct records against Redis's totals (µUSD, requests)."""
    return [
        f"tenant {tenant}: llm.costs has {stream.get(tenant, (0, 0))} (µUSD, requests), "
        f"Redis totals {counted.get(tenant, (0, 0))}"
        for tenant in sorted(set(stream) | set(counted))
        if stream.get(tenant, (0, 0)) != counted.get(tenant, (0, 0))
    ]


def doubled_detail(records: Iterable[CostRecord]) -> list[str]:
    """For each record id on the stream more than once: are the copies identical, or priced apart?"""
    copies: dict[str, list[CostRecord]] = {}
    for record in records:
        copies.setdefault(record.record_id, []).append(record)
    return [
        f"record {record_id} x{len(same)}: cost_micro_usd {[r.cost_micro_usd for r in same]}, "
        f"kind {sorted({r.kind.value for r in same})}, booked_at_ms {[r.booked_at_ms for r in same]}"
        for record_id, same in sorted(copies.items())
        if len(same) > 1
    ][:5]


class Billing:
    """Cost-accounting's effect: every result billed once on llm.costs, and its money conserved in Redis's
    totals. `settings` reads the namespace (the operator, on a secured broker)."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self.topics = t.Topics(settings.topic_prefix)
        self.billed: set[str] = set()
        self._tail: TopicTail | None = None

    async def start(self) -> Billing:
        self._tail = await TopicTail(self.settings, self.topics.name(t.COSTS)).start()
        return self

    async def stop(self) -> None:
        if self._tail is not None:
            await self._tail.stop()

    async def settle(self, result_ids: set[str], timeout_s: float) -> None:
        """Until every result has a cost record or the time is up (the check says which are missing).

        Self-hosted results are priced when their worker's interval closes (60 s, and 30 s of grace, as
        shipped): the wait is for a minute and a half after the last answer at most."""
        assert self._tail is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 120.0)
        while not result_ids <= self.billed and loop.time() < deadline:
            async for record in self._tail.records(max(0.05, min(1.0, deadline - loop.time()))):
                self.billed.add(decode(record, CostRecord).request_id)  # type: ignore[attr-defined]
        # A late copy of a record (a replica redelivering) would come right after: give it a moment.
        async for record in self._tail.records(2.0):
            self.billed.add(decode(record, CostRecord).request_id)  # type: ignore[attr-defined]

    async def redis_totals(self, dimension: str) -> dict[str, dict[str, int]]:
        """value -> metric -> the sum over every month of cost-accounting's `dimension` aggregate."""
        client = redis_client(
            self.settings.redis_url, password=self.settings.redis_password, cluster=self.settings.redis_cluster
        )
        out: dict[str, Counter[str]] = {}
        try:
            pattern = f"{cost_key_root(self.settings.topic_prefix)}agg:m*:{dimension}"
            async for key in client.scan_iter(match=pattern, count=100):
                for field, value in (await asyncio.wait_for(client.hgetall(key), 10)).items():
                    name, _, metric = text_of(field).rpartition("|")
                    out.setdefault(name, Counter())[metric] += int(value)
        finally:
            await client.aclose()
        return {name: dict(metrics) for name, metrics in out.items()}

    async def redis_tenant_totals(self) -> dict[str, tuple[int, int]]:
        """tenant -> (µUSD, requests) summed over the monthly tenant aggregates."""
        totals = await self.redis_totals("tenant")
        return {tenant: (m.get("cost", 0), m.get("requests", 0)) for tenant, m in totals.items()}

    async def check(self, records: list[Seen]) -> tuple[list[str], list[str]]:
        results = results_in(self.topics, records, shadows=True, keys=True)
        costs = costs_in(self.topics, records)
        legs = legs_in(self.topics, records)
        bills = check_bills(
            costs,
            results,
            {},
            {key: len(its) for key, its in legs.items()},
            key_of=lambda r: request_key(r.tenant, r.request_id),
        )
        problems = [f"bills {kind}: {examples[:5]}" for kind, examples in bills.problems.items()]
        problems += doubled_detail(costs)
        problems += leg_bill_problems(legs, costs)
        stream = tenant_totals_of(costs)
        problems += totals_problems(stream, await self.redis_tenant_totals())
        for dimension in ("model", "total"):
            counted = {name: m.get("cost", 0) for name, m in (await self.redis_totals(dimension)).items()}
            counted = {name: n for name, n in counted.items() if n}
            if (summed := cost_by(costs, dimension)) != counted:
                problems.append(f"µUSD by {dimension}: llm.costs has {summed}, Redis totals {counted}")
        total = sum(cost_by(costs, "total").values())
        notes = [
            f"billing: {bills.results} results (shadows included; {len(legs)} continued, billed per leg), "
            f"{bills.billed} billed once, {bills.unbilled} unbilled, {bills.legs_unbilled} with legs unbilled, "
            f"{bills.doubled} record ids doubled, {bills.extra} extra; {len(costs)} cost records, "
            f"{total} µUSD in all, {sum(c for c, _ in stream.values())} booked to tenants "
            f"(Redis totals by tenant, model and overall {'agree' if not problems else 'DISAGREE'})"
        ]
        return problems, notes


def shadow_pairs(topics: t.Topics, records: Iterable[Seen]) -> dict[str, str]:
    """comparison id (`<tenant>:<primary>:<experiment>`) -> primary key, for every primary whose
    result and whose shadow copy's result (`<primary>.shadow.<experiment>`, the same tenant) are
    both on llm.results."""
    name = topics.name(t.RESULTS)
    primaries: set[str] = set()
    shadows: set[str] = set()
    for record in records:
        if record.topic == name and record.value is not None:
            result = InferenceResult.model_validate_json(record.value)
            (shadows if result.shadow else primaries).add(result.request_key)
    pairs = {}
    for shadow_key in shadows:
        primary, _, experiment = shadow_key.partition(".shadow.")
        if primary in primaries and experiment:
            pairs[f"{primary}:{experiment}"] = primary
    return pairs


def comparison_problems(pairs: Iterable[str], comparison_ids: Iterable[str]) -> tuple[list[str], Counter[str]]:
    """Each pair compared: one distinct comparison id per (experiment, primary), none for a pair that
    is not on llm.results. Returns (problems, copies per id); identical copies of one id are the
    comparator's documented redelivery (readers dedupe on the id) and are reported, not failed."""
    copies = Counter(comparison_ids)
    wanted = set(pairs)
    missing = sorted(wanted - set(copies))
    extra = sorted(set(copies) - wanted)
    problems = [f"comparisons missing ({len(missing)}): {missing[:5]}"] if missing else []
    problems += [f"comparisons of no pair ({len(extra)}): {extra[:5]}"] if extra else []
    return problems, copies


MAX_STEPS = 10  # a ramp's steps whose pair aggregates are read


class Comparing:
    """The shadow-comparator's effect: each (experiment, request) pair compared once on
    llm.comparisons and counted once in the experiment's pair aggregate (what decisions read)."""

    def __init__(self, settings: BusSettings, experiment_id: str, step: int = 0, every_request: bool = False) -> None:
        self.settings = settings
        self.topics = t.Topics(settings.topic_prefix)
        self.experiment_id = experiment_id
        self.step = step
        # The experiment shadows every request: settling waits for one shadow per answered request.
        self.every_request = every_request
        self.shadows: set[str] = set()
        self.compared: set[str] = set()
        self._results: TopicTail | None = None
        self._comparisons: TopicTail | None = None

    async def start(self) -> Comparing:
        self._results = await TopicTail(self.settings, self.topics.name(t.RESULTS)).start()
        self._comparisons = await TopicTail(self.settings, self.topics.name(t.COMPARISONS)).start()
        return self

    async def stop(self) -> None:
        for tail in (self._results, self._comparisons):
            if tail is not None:
                await tail.stop()

    async def _read(self, timeout_s: float) -> None:
        assert self._results is not None and self._comparisons is not None
        async for record in self._results.records(timeout_s / 2):
            result = decode(record, InferenceResult)
            if result.shadow:  # type: ignore[attr-defined]
                primary, _, experiment = result.request_key.partition(".shadow.")  # type: ignore[attr-defined]
                self.shadows.add(f"{primary}:{experiment}")
        async for record in self._comparisons.records(timeout_s / 2):
            self.compared.add(decode(record, Comparison).comparison_id)  # type: ignore[attr-defined]

    async def settle(self, result_ids: set[str], timeout_s: float) -> None:
        """Until every shadow result seen is compared and no new shadow came for 2 s, or time is up. With
        `every_request`, not before a shadow of each answered request has been seen: shadows are placed
        after their primaries, and on a loaded machine a pause of 2 s between two of them ended the wait
        with most of them still to come (116 of 160 pairs then looked uncompared)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        quiet_since = loop.time()
        wanted = len(result_ids) if self.every_request else 0
        while loop.time() < deadline:
            before = len(self.shadows)
            await self._read(1.0)
            if len(self.shadows) != before:
                quiet_since = loop.time()
            all_seen = len(self.shadows) >= wanted
            if all_seen and self.shadows <= self.compared and loop.time() - quiet_since >= 2.0:
                return

    async def pair_count(self) -> int:
        """`n` of the experiment's pair aggregates in the comparator's Redis store, over its steps (with
        decisions on, a ramp moves it to the next step)."""
        client = redis_client(
            self.settings.redis_url, password=self.settings.redis_password, cluster=self.settings.redis_cluster
        )
        store = ComparatorStore(client, f"{self.settings.topic_prefix}comparator")  # as the service names it
        n = 0
        try:
            for step in range(self.step, self.step + MAX_STEPS):
                pairs = await asyncio.wait_for(store.read_agg(self.experiment_id, step, "pairs"), 10)
                n += int(pairs.get("n", 0))
        finally:
            await client.aclose()
        return n

    async def check(self, records: list[Seen]) -> tuple[list[str], list[str]]:
        pairs = shadow_pairs(self.topics, records)
        name = self.topics.name(t.COMPARISONS)
        ids = [Comparison.model_validate_json(r.value).comparison_id for r in records if r.topic == name and r.value]
        problems, copies = comparison_problems(pairs, ids)
        counted = await self.pair_count()
        if counted != len(copies):
            problems.append(f"pair aggregate n={counted}, {len(copies)} distinct comparisons")
        redelivered = sum(n - 1 for n in copies.values())
        notes = [
            f"comparisons: {len(pairs)} shadowed pairs on llm.results, {len(copies)} compared "
            f"({redelivered} redelivered copies of an id), pair aggregate n={counted}"
        ]
        return problems, notes


def live_pids(run_dir: Path, prefix: str) -> dict[str, int]:
    """The local actuator's workers of one pool that are alive: process name → pid (its pid files)."""
    alive = {}
    for pid_file in run_dir.glob(f"{prefix}*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            pid = int(pid_file.read_text())
            os.kill(pid, 0)
            alive[pid_file.stem] = pid
    return alive


def decision_chain_problems(decisions: list[ScaleDecision]) -> list[str]:
    """Each decision starts from the count the one before it set (none lost, none applied twice)."""
    problems = []
    for before, after in itertools.pairwise(decisions):
        if after.current_replicas != before.desired_replicas:
            problems.append(
                f"{after.pool}: decision at {after.decided_at_ms} found {after.current_replicas} replicas, "
                f"the one before set {before.desired_replicas} ({before.reason!r} → {after.reason!r})"
            )
    return problems


class Scaling:
    """The autoscaler's effect: each scale decision applied once. Its decisions on llm.scaling chain
    (`decision_chain_problems`), the pool never holds more workers than its maximum, and once the load
    is over it ends with as many live workers as its last decision says (its minimum, 0)."""

    def __init__(self, settings: BusSettings, pool: str, run_dir: Path, prefix: str, max_replicas: int) -> None:
        self.settings = settings
        self.topics = t.Topics(settings.topic_prefix)
        self.pool, self.run_dir, self.prefix, self.max_replicas = pool, run_dir, prefix, max_replicas
        self.most_alive = 0
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> Scaling:
        self._watch = asyncio.create_task(self._count())
        return self

    async def _count(self) -> None:
        while True:
            self.most_alive = max(self.most_alive, len(live_pids(self.run_dir, self.prefix)))
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch

    async def settle(self, result_ids: set[str], timeout_s: float) -> None:
        """Until no worker of the pool is alive (the idle pool went back to 0), or the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while live_pids(self.run_dir, self.prefix) and loop.time() < deadline:
            await asyncio.sleep(0.5)

    async def check(self, records: list[Seen]) -> tuple[list[str], list[str]]:
        name = self.topics.name(t.SCALING)
        decisions = [
            d
            for d in (ScaleDecision.model_validate_json(r.value) for r in records if r.topic == name and r.value)
            if d.pool == self.pool
        ]  # one pool: one partition, so offset order is decision order
        problems = decision_chain_problems(decisions)
        alive = live_pids(self.run_dir, self.prefix)
        last = decisions[-1].desired_replicas if decisions else 0
        if len(alive) != last:
            problems.append(f"{self.pool}: {len(alive)} workers alive {sorted(alive)}, the last decision says {last}")
        if self.most_alive > self.max_replicas:
            problems.append(f"{self.pool}: {self.most_alive} workers alive at once, the maximum is {self.max_replicas}")
        if not any(d.action == "up" for d in decisions):
            problems.append(f"{self.pool}: never scaled up: the scenario tested nothing")
        moves = [f"{d.current_replicas}→{d.desired_replicas}" for d in decisions]
        return problems, [f"scale decisions {moves}; at most {self.most_alive} workers alive at once"]
