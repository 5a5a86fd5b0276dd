"""The gateway under streaming HTTP load meets, mid-run, undecodable records on its reply topic (written by
a worker's principal, as a worker of a newer schema or a bug would: five keyed by no live request, five by
the requests accepted last, still streaming) and slow clients: streams read a line a second, and
connections that send their headers (slowloris) or their body a byte at a time.

Pass criteria, fixed before the run, with the shipped gateway settings (10 s for headers, 30 s for a
body): every request a client saw accepted has exactly one result and no error result; every accepted
stream, the slow ones included, ends with [DONE], an SSE error event (one whose chunk was undecodable)
or a broken connection, never silently; each slowloris connection is closed by the gateway within its
deadline (+5 s); the gateway dead-letters at most the five keyed by its requests (it decodes only the
chunks a stream still waits for: stray ones, and those of a stream already finished, are skipped; how
many it caught is reported, since a sim stream often ends within the write); its reply tail lives on
(requests accepted after the poison complete); the gateway never exits."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from llmbus.bus import make_producer
from llmbus.bus.producer import stop_producer
from llmbus.contract import topics as t
from llmbus_tools.harness.ports import free_port
from llmbus_tools.harness.reliability.deployment import Deployment
from llmbus_tools.harness.reliability.gateway import api_keys, wait_ready
from llmbus_tools.harness.reliability.load import MODEL, Answers, make_request
from llmbus_tools.harness.reliability.verdict import ErrorBudget, Outcome, finish
from tests.reliability.common import Faults, Run, Scenario, at, deployed
from tests.reliability.gateway import HttpLoad

INSTANCE = "gw-rel"
HEADER_TIMEOUT_S = 10.0  # GatewaySettings.header_timeout_s, as shipped
BODY_TIMEOUT_S = 30.0  # GatewaySettings.body_timeout_s
STRAY_POISON = 5
LIVE_POISON = 5  # keyed by the requests accepted last: at least one is still streaming
SLOW_READERS = 10
SLOWLORIS = 10


@dataclass
class SlowClients:
    base_url: str
    keys: dict[str, str]
    tenants: list[str]
    accepted: list[str] = field(default_factory=list)
    ended: dict[str, int] = field(default_factory=dict)  # how each slow stream ended
    silent: list[str] = field(default_factory=list)
    closed_in_s: list[float] = field(default_factory=list)  # slowloris: how long until the gateway closed it
    held_open: int = 0  # slowloris connections still open past their deadline

    def _end(self, how: str) -> None:
        self.ended[how] = self.ended.get(how, 0) + 1

    async def read_slowly(self, http: httpx.AsyncClient, i: int) -> None:
        request = make_request(10_000 + i, random.Random(i), self.tenants)
        body = {"model": MODEL, "prompt": request.prompt, "max_tokens": 30, "stream": True}
        headers = {"Authorization": f"Bearer {self.keys[request.tenant]}"}
        try:
            async with http.stream("POST", f"{self.base_url}/v1/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    return self._end(f"HTTP {response.status_code}")
                request_id = response.headers["x-request-id"]
                self.accepted.append(request_id)
                async for line in response.aiter_lines():
                    if line == "data: [DONE]":
                        return self._end("[DONE]")
                    if line.startswith("data: ") and "error" in json.loads(line.removeprefix("data: ")):
                        return self._end("error event")
                    await asyncio.sleep(1.0)  # a line a second
                self.silent.append(request_id)
        except httpx.HTTPError as exc:
            self._end(type(exc).__name__)
        return None

    async def slowloris(self, body_too: bool) -> None:
        """Headers (or, with `body_too`, complete headers and then a body) a byte at a time."""
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += b"Content-Length: 200\r\n\r\n" if body_too else b""
        trickle = b'{"model": "x", "prompt": "' if body_too else b"X-Slow: " + b"a" * 200
        deadline_s = (BODY_TIMEOUT_S if body_too else HEADER_TIMEOUT_S) + 5
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", int(self.base_url.rsplit(":", 1)[1]))
        try:
            writer.write(head)
            await writer.drain()
            for byte in trickle:
                if time.monotonic() - started > deadline_s:
                    self.held_open += 1
                    return
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(1024), 1.0) == b"" or reader.at_eof():
                        break
                except TimeoutError:
                    continue
                except (ConnectionError, OSError):
                    break
            self.closed_in_s.append(round(time.monotonic() - started, 1))
        finally:
            writer.close()


async def poison(
    deployment: Deployment, reply_topic: str, live: Callable[[], list[str]], faults: Faults
) -> tuple[list[tuple[str, int, int]], int]:
    """Undecodable chunks on the gateway's reply topic, as a worker's principal writes them, keyed by no
    request and by the requests `live` names once the producer is up; where they are, and how many live."""
    producer = make_producer(deployment.settings(t.WORKER), client_id="poison")
    await asyncio.wait_for(producer.start(), 30)
    live_ids = live()
    keys = [uuid.uuid4().hex for _ in range(STRAY_POISON)] + live_ids
    written = []
    try:
        for key in keys:
            value = json.dumps({"request_id": key, "tenant": "rel-0", "seq": "one"}).encode()  # seq: not an int
            sent = await asyncio.wait_for(producer.send_and_wait(reply_topic, value, key=key.encode()), 30)
            written.append((sent.topic, sent.partition, sent.offset))
    finally:
        await stop_producer(producer, 30)
    faults.note(f"{len(keys)} undecodable chunks on {reply_topic} ({len(live_ids)} of requests just accepted)")
    return written, len(live_ids)


async def run(run: Run) -> Outcome:
    faults = Faults()
    size = run.size
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    deployment = run.deployment()
    async with deployed(deployment, run.log_dir) as running:
        stack = running.stack
        keys = await api_keys(deployment.operator, deployment.tenants)
        stack.gateway(port, INSTANCE)
        await wait_ready(base_url)
        load = HttpLoad(base_url, keys, size.requests, min(size.rate_per_s, size.requests / 16), deployment.tenants)
        slow = SlowClients(base_url, keys, deployment.tenants)
        poisoned: list[int] = []
        planted: list[tuple[str, int, int]] = []
        accepted_before_poison: list[int] = []

        async def inject() -> None:
            accepted_before_poison.append(len(load.accepted))
            where, live = await poison(
                deployment, deployment.topics.replies(INSTANCE), lambda: load.accepted[-LIVE_POISON:], faults
            )
            planted.extend(where)
            poisoned.append(live)

        async def slow_clients() -> None:
            limits = httpx.Limits(max_connections=SLOW_READERS, max_keepalive_connections=0)
            async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=5), limits=limits) as http:
                await asyncio.gather(
                    *(slow.read_slowly(http, i) for i in range(SLOW_READERS)),
                    *(slow.slowloris(body_too=i % 2 == 1) for i in range(SLOWLORIS)),
                )
            faults.note(
                f"slow clients: streams ended {slow.ended}, slowloris closed after {sorted(slow.closed_in_s)} s"
            )

        started = time.monotonic()
        faults.started = started
        answers = await Answers(deployment).start()
        try:
            hooks = {at(size, 0.2): faults.spawn(slow_clients), at(size, 0.4): faults.spawn(inject)}
            await load.run(hooks)
            await faults.done()
            outcome = await finish(
                "gateway_poison_slow_clients",
                stack,
                answers,
                [*load.accepted, *slow.accepted],
                started,
                answer_timeout_s=size.answer_timeout_s,
                budget=ErrorBudget(),
                notes=[*faults.notes, load.summary()],
                effects=[running.billing],
                planted=planted,
            )
        finally:
            await answers.stop()
        problems = outcome.effect_problems
        if load.silent or slow.silent:
            problems.append(f"accepted streams that ended silently: {[*load.silent, *slow.silent][:5]}")
        if slow.held_open:
            problems.append(f"{slow.held_open} slowloris connections still open past their deadline")
        letters = sum(n for by, n in outcome.report.dead_letters_by.items() if by.startswith(f"{t.GATEWAY}/"))
        live = sum(poisoned)
        outcome.notes.append(f"the gateway dead-lettered {letters} of the {live} keyed by its requests")
        if letters > live:
            problems.append(f"the gateway dead-lettered {letters} chunks, more than the {live} keyed by its requests")
        if len(load.accepted) <= (accepted_before_poison or [0])[0]:
            problems.append("nothing was accepted after the poison: its reply tail was not shown to live on")
        if any(c.startswith("gateway") for c in stack.crashes):
            problems.append(f"the gateway exited: {stack.crashes}")
        return outcome


SCENARIO = Scenario(
    "gateway_poison_slow_clients", run, "undecodable chunks on the gateway's reply topic; slow readers and slowloris"
)
