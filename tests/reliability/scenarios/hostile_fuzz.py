"""Hostile records (drawn with Hypothesis: tests/reliability/hostile.py) mixed into the valid load, each
written by a tenant (`rel-0`, as its own principal, on its own request topic) as raw bytes, as any client
can: every one must end as a result or a DLQ entry with a reason, and no valid request may suffer.

Errors allowed, fixed before the run, at most one per hostile record with a request id:
- `forbidden`, for the kinds that name another tenant in the body than the topic's (`tenant`,
  `foreign`) or a reply topic outside the tenant's namespace (`reply_topic`): the router takes the
  tenant from the topic and refuses the body's claim;
- `invalid_request`, `malformed`, `request_too_large`, `prompt_too_long`, `max_tokens_too_large`, for any
  hostile record: it breaks a limit of InferenceRequest or of the bus.
A valid request gets none, and nothing is answered `internal`."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaProducer

from llmbus.bus.codec import MAX_ID_CHARS
from llmbus.bus.security import kafka_auth
from llmbus.security.tenancy import default_reply_topic
from llmbus_tools.harness.reliability.load import Load
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome
from tests.reliability.common import Faults, Run, Scenario, deployed, run_scenario
from tests.reliability.hostile import DUPLICATE, FOREIGN, Hostile, draw_corpus

WRITER = "rel-0"  # the tenant that writes the hostile records
CLIENT_INPUT_ERRORS = ("invalid_request", "malformed", "request_too_large", "prompt_too_long", "max_tokens_too_large")
CLAIMS_ANOTHER = ("tenant", "foreign", "reply_topic")  # kinds a tenant's topic may refuse as forbidden


def answerable(request_id: str) -> bool:
    """Ids judged one by one (exactly one result each): those a request can carry and the router can
    answer under (`llmbus.bus.codec`: 1..128 printable characters). Not these: an id with a lone
    surrogate is no UTF-8 text, so no Kafka key or result can carry it; a longer one or one with
    CR/LF is refused without an answer when the rest of the request is bad too; "" names nobody.
    Their records must still end as a result or in the DLQ (the audit's account of the request topics)."""
    return 0 < len(request_id) <= MAX_ID_CHARS and request_id.isprintable()


def resolve(record: Hostile, valid_ids: list[str]) -> Hostile:
    """The writer's own tenant and reply topic in the body (but for the kinds that claim others), and
    duplicated and foreign ids made the id of a valid request already sent."""
    if record.value is None:
        return record
    value = record.value
    if record.kind not in ("tenant", "foreign"):
        value = value.replace(b'"tenant": "fuzz"', f'"tenant": "{WRITER}"'.encode())
    if record.kind != "reply_topic" and value.startswith(b"{") and b'"reply_topic"' not in value:
        # Answered on the writer's own reply topic, as its client asks on a broker that authenticates it.
        value = b'{"reply_topic": "' + default_reply_topic(True, WRITER).encode() + b'", ' + value[1:]
    if valid_ids and record.request_id in (DUPLICATE, FOREIGN):
        target = f'"{valid_ids[len(valid_ids) // 2]}"'.encode()
        value = value.replace(b'"\\u0000duplicate"', target).replace(b'"\\u0000foreign"', target)
    return Hostile(record.kind, record.key, value)


async def run(run: Run) -> Outcome:
    size = run.size
    corpus = draw_corpus(size.hostile)
    every = max(1, size.requests // max(1, size.hostile))
    faults = Faults()
    hostile_ids: dict[str, str] = {}  # request id → kind
    valid_ids: list[str] = []
    refused: list[str] = []
    queue = list(corpus)
    deployment = run.deployment()
    async with deployed(deployment, run.log_dir) as running:
        # Not idempotent: a record the broker refuses (too large) must not poison the next ones' sequence.
        writer = deployment.tenant(WRITER)
        raw = AIOKafkaProducer(
            bootstrap_servers=writer.kafka_bootstrap, acks="all", max_request_size=4 * 2**20, **kafka_auth(writer)
        )
        await asyncio.wait_for(raw.start(), 30)
        topic = deployment.request_topic(WRITER)

        async def send_hostile(_: int) -> None:
            for _ in range(max(1, size.hostile // size.requests)):
                if not queue:
                    return
                record = resolve(queue.pop(), valid_ids)
                key = record.key if record.key is not None or record.value is not None else b"tombstone"
                try:  # raw bytes, raw key, no headers: what any tenant's client can write
                    delivery = await asyncio.wait_for(raw.send(topic, record.value, key=key), 15)
                    await asyncio.wait_for(delivery, 15)
                except Exception as exc:  # noqa: BLE001 - the broker refusing a record is an outcome too
                    refused.append(f"{record.kind}: {type(exc).__name__}")
                    continue
                if record.request_id is not None and answerable(record.request_id):
                    hostile_ids[record.request_id] = record.kind

        class ValidLoad(Load):
            def request(self, i, rng):  # type: ignore[no-untyped-def]
                request = super().request(i, rng)
                valid_ids.append(request.request_id)
                return request

        hooks: dict[int, Callable[[int], Awaitable[None]]] = {i: send_hostile for i in range(1, size.requests, every)}
        budget = ErrorBudget()
        try:
            load = ValidLoad(deployment, size.requests, size.rate_per_s)

            async def rest(_: int) -> None:
                while queue:  # whatever the hooks did not place
                    await send_hostile(0)

            hooks[size.requests - 1] = rest
            faults.note(f"{size.hostile} hostile records drawn")
            outcome = await run_scenario(
                "hostile_fuzz",
                running,
                size,
                hooks,
                faults,
                budget,
                load,
                account_requests=True,
                extra_ids=lambda: list(hostile_ids),
                before_finish=lambda: _fix_budget(budget, hostile_ids, faults, refused),
            )
            return outcome
        finally:
            await asyncio.wait_for(raw.stop(), 30)


def _fix_budget(budget: ErrorBudget, hostile_ids: dict[str, str], faults: Faults, refused: list[str]) -> None:
    """The allowances, once every hostile record is sent (which ids they are is known only then)."""
    claims = [rid for rid, kind in hostile_ids.items() if kind in CLAIMS_ANOTHER]
    budget.allow(("forbidden",), len(claims), "the body claims another tenant or reply topic than its topic's", claims)
    budget.allow(CLIENT_INPUT_ERRORS, len(hostile_ids), "a hostile record breaks a limit", list(hostile_ids))
    faults.note(
        f"{len(hostile_ids)} hostile records with a request id ({len(claims)} claiming another tenant or reply "
        f"topic), {len(refused)} refused by the broker ({sorted(set(refused))[:5]})"
    )


SCENARIO = Scenario("hostile_fuzz", run, "hostile records (Hypothesis) written by a tenant among the valid load")
