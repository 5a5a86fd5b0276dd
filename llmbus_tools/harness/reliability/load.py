"""The load a fault scenario sends, as its tenants would (each its own principal, on its own request
topic), and the answers it waits for (llm.results, read as the operator)."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from llmbus.bus import Bus, decode
from llmbus.client import TopicTail
from llmbus.contract import topics as t
from llmbus.contract.messages import InferenceRequest, InferenceResult
from llmbus.security.tenancy import default_reply_topic
from llmbus_tools.harness.reliability.deployment import Deployment

MODEL = "sim-llama-8b"


def make_request(i: int, rng: random.Random, tenants: list[str], own_replies: bool = False) -> InferenceRequest:
    """Valid load: varied lengths; one in ten deterministic and repeated (the router's cache answers some).
    `own_replies`: answered on the tenant's own reply topic (as on a broker that authenticates it)."""
    deterministic = i % 10 == 0
    prompt = f"reliability probe {rng.randrange(20) if deterministic else i}: " + "words " * rng.randrange(4, 60)
    tenant = tenants[i % len(tenants)]
    return InferenceRequest(
        tenant=tenant,
        model=MODEL,
        prompt=prompt,
        max_tokens=rng.randrange(4, 40),
        temperature=0.0 if deterministic else 1.0,
        reply_topic=default_reply_topic(own_replies, tenant),
    )


Hook = Callable[[int], Awaitable[None]]
MakeRequest = Callable[[int, random.Random], InferenceRequest]


@dataclass
class Load:
    """A bounded stream of requests at a fixed rate, each on its tenant's own request topic as that
    tenant; `hooks[i]` runs before request i is sent; `make` makes request i from the load's rng (None:
    `make_request`'s varied load)."""

    deployment: Deployment
    requests: int
    rate_per_s: float
    seed: int = 7
    hooks: dict[int, Hook] = field(default_factory=dict)
    sent_ids: list[str] = field(default_factory=list)
    make: MakeRequest | None = None

    def request(self, i: int, rng: random.Random) -> InferenceRequest:
        return make_request(i, rng, self.deployment.tenants, own_replies=self.deployment.broker is not None)

    async def run(self, make: MakeRequest | None = None) -> list[str]:
        """Send every request at the rate, whatever the broker does: each is published in a task of its
        own until acknowledged (`Publisher.publish` with the bus's retry time), so a broker or a partition
        leader away only delays acks, and the next requests still go out on time.

        Not `Publisher.send` and its future: while a partition's batch waits for a leader, aiokafka lets
        nothing more into that partition, and a send then fails after request_timeout_ms (what a client
        does then is send again, as `publish` does)."""
        make = make or self.make or self.request
        rng = random.Random(self.seed)
        deployment = self.deployment
        buses = {
            tenant: await Bus.start(deployment.tenant(tenant), t.CLIENT, client_suffix=f"-load-{tenant}")
            for tenant in deployment.tenants
        }
        started = time.monotonic()
        deliveries: list[asyncio.Task[None]] = []
        retry_s = deployment.base.publish_retry_s
        try:
            for i in range(self.requests):
                if (hook := self.hooks.get(i)) is not None:
                    await hook(i)
                request = make(i, rng)
                topic = deployment.request_topic(request.tenant)
                publish = buses[request.tenant].publisher.publish(
                    topic, request, key=request.request_id, retry_for_s=retry_s
                )
                deliveries.append(asyncio.create_task(publish))
                self.sent_ids.append(request.request_id)
                if i % 500 == 0:
                    print(f"  sent {i}/{self.requests} at t+{time.monotonic() - started:.1f}s", file=sys.stderr)
                behind_s = (i + 1) / self.rate_per_s - (time.monotonic() - started)
                if behind_s > 0:
                    await asyncio.sleep(behind_s)
            # Every request acknowledged: a record the broker never took was never sent.
            await asyncio.wait_for(asyncio.gather(*deliveries), retry_s + deployment.base.send_timeout_s)
        finally:
            for delivery in deliveries:
                delivery.cancel()
            for bus in buses.values():
                await bus.stop()
        return self.sent_ids


class Answers:
    """Counts distinct request ids answered on llm.results (a tail started before the load)."""

    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment
        self.seen: set[str] = set()
        self._tail: TopicTail | None = None

    async def start(self) -> Answers:
        settings = self.deployment.operator
        self._tail = await TopicTail(settings, self.deployment.topics.name(t.RESULTS)).start()
        return self

    async def wait(self, ids: list[str], timeout_s: float, settle_s: float = 3.0) -> int:
        """Until every id has a result or the time is up, then `settle_s` more (late doubles show up)."""
        assert self._tail is not None
        wanted = set(ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not wanted <= self.seen and loop.time() < deadline:
            await self._read(min(1.0, deadline - loop.time()))
        await self._read(settle_s)
        return len(wanted & self.seen)

    async def _read(self, timeout_s: float) -> None:
        assert self._tail is not None
        async for record in self._tail.records(max(timeout_s, 0.05)):
            self.seen.add(decode(record, InferenceResult).request_id)  # type: ignore[arg-type]

    async def stop(self) -> None:
        if self._tail is not None:
            await self._tail.stop()
