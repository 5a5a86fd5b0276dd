"""The `openai-http` engine: any OpenAI-compatible server (hosted providers, `vllm serve`, peers).

Streams `POST {base_url}/chat/completions` (or `/completions`) with `stream=true` and
`stream_options.include_usage`, so the last SSE chunk carries the authoritative token usage.
Per-chunk token counts are not in the protocol: each non-empty content chunk counts as one
token (what vLLM and most providers send) until the usage chunk corrects the total.
Abort closes the HTTP stream, which is how an OpenAI-compatible server learns to stop.

A chat goes to a chat API as the client sent it (every message, its role, order and fields); only
a completions API gets the chat rendered as one prompt.

Failures are a policy (OPENAI_HTTP.md, "Failures"). One run of the engine is one leg of the answer
(docs/delivery.md, "Continuation across legs"), made of tries (openai_try.py), each one HTTP request to one
deployment of the model (openai_deployments.py). A try that fails (openai_failures.py) before any token of
the leg went out is followed by another on a deployment the request has not failed on, or on the same one
where trying again can help (after its Retry-After, up to `max_retry_after_s`; openai_tries.py). One that
fails after its tokens went out ends the leg (LegCut): the worker continues the answer from exactly what
was sent, here (`in_process`: a deployment that can take a partial answer, openai_continuation.py) or on
another worker. When no deployment can take the next try the request goes back to the scheduler with why
(UpstreamFailed): another worker of the model, the next model of the route's chain, or the request's final
error with a retry hint. Repeated failures of a deployment open its circuit breaker; the worker reports
DEGRADED while every deployment's is open, until a probe succeeds. Settings: engines/openai_http_config.py,
documented in engines/OPENAI_HTTP.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import httpx

from llmbus.contract.engine_features import ENGINE_FEATURES
from llmbus.contract.messages import ErrorCode
from llmbus.tokens import count_tokens
from llmbus_services.engine_worker.adapters.engines.openai_body import request_body
from llmbus_services.engine_worker.adapters.engines.openai_continuation import can_continue, continued_body
from llmbus_services.engine_worker.adapters.engines.openai_deployments import Deployment, DeploymentPool
from llmbus_services.engine_worker.adapters.engines.openai_failures import (
    FailureKind,
    TryFailure,
    engine_error,
    retry_after_s,
    status_failure,
)
from llmbus_services.engine_worker.adapters.engines.openai_http_config import OpenAIHttpConfig
from llmbus_services.engine_worker.adapters.engines.openai_tries import Tries
from llmbus_services.engine_worker.adapters.engines.openai_try import Opened, Tally, TryEnd, TryPlan, run_try
from llmbus_services.engine_worker.core.continuation import continuable
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    LegCut,
    UpstreamBusy,
    UpstreamFailed,
    answer_room,
)

__all__ = ["OpenAIHttpConfig", "OpenAIHttpEngine", "retry_after_s", "upstream_error"]
log = logging.getLogger(__name__)

# Headers worth forwarding to the server: W3C trace context (vLLM serve and most gateways read it).
_FORWARDED_HEADERS = ("traceparent", "tracestate", "baggage")


def upstream_error(status: int, body: str, retry_after: str | None = None, busy_cooldown_s: float = 1.0) -> EngineError:
    """What the worker hears of an upstream that answered `status`, with no other deployment to try."""
    return engine_error(status_failure(status, body, retry_after), busy_cooldown_s=busy_cooldown_s)


class OpenAIHttpEngine:
    name = "openai-http"

    def __init__(
        self,
        config: OpenAIHttpConfig,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.pool = DeploymentPool(config, clock)
        self.model = config.model
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self._transport = transport
        self._open: dict[str, Opened] = {}  # request id → its leg in flight
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._cached_tokens_total = 0

    async def start(self) -> None:
        if not self.pool.started:
            self.pool.start(self._transport)

    async def warmup(self) -> None:
        """Each deployment answers (no completion is sent: a hosted one would bill it); one that does not
        starts with its circuit open (its probe tells when it answers); none answering is a dead engine."""
        failures = []
        for deployment in self.pool.deployments:
            reason = await self._unreachable(deployment)
            if reason is not None:
                failures.append(reason)
                deployment.breaker.trip(reason)
        if len(failures) == len(self.pool.deployments):
            raise EngineDead("; ".join(failures))

    async def _unreachable(self, deployment: Deployment) -> str | None:
        client = self._client(deployment)
        try:
            resp = await client.get("/models")
        except httpx.HTTPError as exc:
            return f"cannot reach {deployment.config.base_url}: {exc!r}"
        if resp.status_code >= 500:
            return f"{deployment.config.base_url}/models answered HTTP {resp.status_code}"
        return None

    async def stop(self) -> None:
        for opened in list(self._open.values()):
            await opened.abort()
        await self.pool.stop()

    def _client(self, deployment: Deployment) -> httpx.AsyncClient:
        return deployment.clients[deployment.least_busy_client()]

    @property
    def features(self) -> frozenset[str]:
        """What this upstream honours: every parameter of the kind, less those its settings say it refuses."""
        return ENGINE_FEATURES[self.name] - set(self.config.refuses)

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        return count_tokens(text, self.config.tokenizer or tokenizer)

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise AdmissionError(
                f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}"
            )
        if len(self._open) >= self.max_num_seqs:
            raise AdmissionError(f"{len(self._open)} requests in flight, max_num_seqs {self.max_num_seqs}")

    def _sends_chat(self, request: EngineRequest) -> bool:
        """Whether this request goes to /chat/completions (else /completions)."""
        if self.config.api == "auto":
            return bool(request.messages)
        return self.config.api == "chat"

    # -- health ------------------------------------------------------------------------------------
    @property
    def upstream_degraded(self) -> bool:
        return self.pool.degraded

    async def probe_upstream_if_due(self) -> None:
        """Half-open: one small request per deployment decides whether its breaker closes or stays open (longer)."""
        for deployment in self.pool.deployments:
            if not deployment.breaker.start_probe():
                continue
            try:
                failure = await self._probe(deployment)
            except httpx.HTTPError as exc:
                failure = f"probe: {exc!r}"
            if failure is None:
                deployment.breaker.record_success()
            else:
                deployment.breaker.record_failure(failure)

    async def _probe(self, deployment: Deployment) -> str | None:
        """None if the upstream answers (a 4xx, 429 or 503 too: it is there; busy has its own cooldown)."""
        client = self._client(deployment)
        if self.config.breaker.probe == "models":
            resp = await client.get("/models")
        else:
            chat = self.config.api != "completions"
            probe = EngineRequest("breaker-probe", "ping", max_tokens=1, temperature=0.0)
            body = request_body(probe, chat, self.config) | {"stream": False, "model": deployment.config.upstream_model}
            body.pop("stream_options")
            resp = await client.post("/chat/completions" if chat else "/completions", json=body)
        if resp.status_code >= 500 and resp.status_code != 503:
            return f"probe: upstream HTTP {resp.status_code}: {resp.text[:200]}"
        return None

    # -- answering ---------------------------------------------------------------------------------
    def can_continue(self, request: EngineRequest) -> bool:
        """Whether a deployment of this model can write on from a partial answer (core/continuation.py)."""
        chat = self._sends_chat(request)
        return any(can_continue(d.config.continuation or "none", chat) for d in self.pool.deployments)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        so_far = request.continuation
        prompt_tokens = self.count_tokens(request.prompt, request.tokenizer)
        read_tokens = prompt_tokens + (so_far.completion_tokens if so_far is not None else 0)
        auto, window = request.max_tokens_auto, self.max_model_len  # an unset max_tokens: what the window leaves
        room = answer_room(read_tokens, request.max_tokens, auto, window)
        self.check_admission(read_tokens, room)
        opened = Opened()
        self._open[request.request_id] = opened
        try:
            # aclosing: a caller that stops reading closes the HTTP stream now, not when it is collected.
            async with contextlib.aclosing(self._answer(request, read_tokens, read_tokens + room, opened)) as outs:
                async for out in outs:
                    yield out
        finally:
            self._open.pop(request.request_id, None)

    async def _answer(
        self, request: EngineRequest, read_tokens: int, tokens: int, opened: Opened
    ) -> AsyncGenerator[EngineOutput, None]:
        """One leg of the answer: tries on deployments until one answers to its finish reason. A try that fails
        before any token of this leg went out is followed by another; one that fails after ends the leg
        (LegCut): the worker continues the answer in a next leg, here or on another worker."""
        chat = self._sends_chat(request)
        continuing = request.continuation is not None and bool(request.continuation.text)
        deadline_s = time.monotonic() + self.config.request_timeout_s
        tries = Tries.of(request, self.pool.deployments, self.config.retries)
        tally = Tally()
        failure: TryFailure | None = None
        while True:
            deployment = await self._next_deployment(continuing, chat, tokens, tries)
            if opened.aborted:
                yield self._ended(tally, read_tokens)
                return
            if deployment is None:
                raise self._no_deployment(failure, read_tokens, tokens)
            tries.start(deployment)
            try:
                async for item in self._try(deployment, request, chat, read_tokens, tally, opened, deadline_s):
                    if isinstance(item, TryEnd):
                        deployment.breaker.record_success()
                        yield self._final(item, tally, read_tokens, deployment)
                        return
                    yield item
            except TryFailure as failed:
                if opened.aborted:
                    yield self._ended(tally, read_tokens)
                    return
                failure = failed
                tries.failed(deployment, failed, self.config, self.pool.clock())
                if failed.final:  # every deployment of the model would say the same
                    raise self._no_deployment(failed, read_tokens, tokens) from None
                if failed.mid_answer:
                    raise self._cut(request, chat, deployment, failed, tally, tries.excluded) from None

    def _cut(
        self,
        request: EngineRequest,
        chat: bool,
        deployment: Deployment,
        failed: TryFailure,
        tally: Tally,
        excluded: set[str],
    ) -> LegCut:
        """A leg that broke off after its tokens went out: continued in this process where a deployment it has
        not failed too often can take the partial answer, else on another worker (or the chain's next model)."""
        here = (
            continuable(request) is None
            and not tally.calls_streamed
            and any(
                d.name not in excluded and can_continue(d.config.continuation or "none", chat)
                for d in self.pool.deployments
            )
        )
        return LegCut(
            f"upstream {deployment.name}: {failed}",
            in_process=here,
            model=deployment.config.upstream_model,
            deployment=deployment.name,
            code=ErrorCode.MODEL_UNAVAILABLE,
        )

    async def _next_deployment(self, continuing: bool, chat: bool, tokens: int, tries: Tries) -> Deployment | None:
        """The deployment of the next try: one free now, or the first to be free within `max_retry_after_s`
        (waited for); None when none will be. A continued answer goes only where it can be continued."""

        def fits(d: Deployment) -> bool:
            return not continuing or can_continue(d.config.continuation or "none", chat)

        for _ in range(2):
            deployment, wait_s = self.pool.choose(tokens, tries.excluded, tries.not_before, tries.counts, fits)
            if deployment is not None or wait_s is None or wait_s > self.config.max_retry_after_s:
                return deployment
            await asyncio.sleep(wait_s)
        return None

    def _no_deployment(self, failure: TryFailure | None, read_tokens: int, tokens: int) -> EngineError:
        free_in_s = self.pool.free_in_s(tokens)
        if failure is not None and failure.kind != FailureKind.BUSY and not self.pool.degraded:
            free_in_s = None  # free now, failing: no time to name
        if failure is None:
            if self.pool.degraded:
                reasons = "; ".join(d.breaker.last_failure[:200] for d in self.pool.deployments)
                return UpstreamFailed(f"every deployment's circuit is open ({reasons})", retry_after_s=free_in_s)
            wait_s = free_in_s if free_in_s is not None else self.config.busy_cooldown_s
            return UpstreamBusy("every deployment is busy or at its limits", wait_s)
        return engine_error(failure, read_tokens, self.config.busy_cooldown_s, free_in_s)

    async def _try(
        self,
        deployment: Deployment,
        request: EngineRequest,
        chat: bool,
        read_tokens: int,
        tally: Tally,
        opened: Opened,
        deadline_s: float,
    ) -> AsyncGenerator[EngineOutput | TryEnd, None]:
        body = request_body(request, chat, self.config) | {"model": deployment.config.upstream_model}
        if request.continuation is not None:
            continued_body(body, request.continuation.text, deployment.config.continuation or "none", chat)
        headers = {k: v for k, v in request.trace_headers.items() if k.lower() in _FORWARDED_HEADERS}
        headers["X-Request-Id"] = request.request_id
        plan = TryPlan(
            path="/chat/completions" if chat else "/completions",
            body=body,
            headers=headers,
            chat=chat,
            logprobs=request.logprobs,
            prompt_tokens=read_tokens,
            first_token_s=self.config.first_token_timeout_s + read_tokens / self.config.first_token_prompt_tokens_per_s,
            stall_s=self.config.stall_timeout_s,
            deadline_s=deadline_s,
            model=deployment.config.upstream_model or self.model,
            deployment=deployment.name,
        )
        slot = deployment.least_busy_client()
        deployment.sent(self.pool.clock(), read_tokens)
        streams_on = deployment.streams_on  # this start's: a restart makes new ones
        streams_on[slot] += 1
        try:
            async with contextlib.aclosing(run_try(deployment.clients[slot], plan, tally, opened)) as items:
                async for item in items:
                    yield item
        finally:
            streams_on[slot] -= 1
            opened.response = None

    def _final(self, end: TryEnd, tally: Tally, read_tokens: int, deployment: Deployment) -> EngineOutput:
        """The leg's last output: the upstream's usage where it sent it (what it read, what it wrote)."""
        usage = end.usage or {}
        prompt = int(usage.get("prompt_tokens", read_tokens))
        completion = int(usage.get("completion_tokens", tally.completion_tokens))
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        self._prompt_tokens_total += prompt
        self._generation_tokens_total += completion
        self._cached_tokens_total += cached
        out = EngineOutput(
            "",
            max(0, completion - tally.completion_tokens),
            prompt,
            completion,
            # A cache shared by every tenant of the account: a hit may be another tenant's prompt.
            cached_prompt_tokens=cached if self.config.prompt_cache == "salted" else 0,
            finished=True,
            finish_reason=end.finish_reasons[0],
            model=deployment.config.upstream_model,
            deployment=deployment.name,
        )
        tally.completion_tokens = completion
        return out

    def _ended(self, tally: Tally, read_tokens: int) -> EngineOutput:
        """The last output of an aborted leg."""
        self._generation_tokens_total += tally.completion_tokens
        return EngineOutput("", 0, read_tokens, tally.completion_tokens, finished=True, finish_reason="abort")

    async def abort(self, request_id: str) -> None:
        opened = self._open.get(request_id)
        if opened is not None:
            await opened.abort()

    def stats(self) -> EngineStats:
        return EngineStats(
            num_requests_running=len(self._open),
            prompt_tokens_total=self._prompt_tokens_total,
            prefix_cache_queries_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            prefix_cache_hits_total=self._cached_tokens_total,
        )
