"""The `sim` engine: SimCore (vLLM-like scheduling in virtual time) behind the Engine protocol.

One background task steps the core while there is work and sleeps each step's
simulated duration / `speedup` (0: no sleeping, as fast as the CPU goes); the outputs
of a step reach each request's `generate()` iterator through its own outbox once the
step's time has passed, like tokens leaving a real engine after the forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from llmbus.tokens import pseudo_tokens, try_load
from llmbus_services.engine_worker.adapters.engines.sim.core import RequestOutput, SimCore, SimRequest
from llmbus_services.engine_worker.adapters.engines.sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from llmbus_services.engine_worker.adapters.engines.sim.text import AnswerText
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
)

# Falling further behind the simulated clock than this (a busy event loop) resets the
# pacing instead of bursting steps to catch up.
_MAX_LAG_S = 0.05


class _Outbox:
    """One request's step outputs on their way to its `generate()`.

    Not an asyncio.Queue: the step loop appends and wakes the reader only if it waits, and the
    reader takes everything delivered since it last looked in one go. At zero time this path
    runs once per token of every request, so its cost is most of the engine's.
    """

    __slots__ = ("_items", "_loop", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._items: list[RequestOutput | BaseException] = []
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: RequestOutput | BaseException) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list[RequestOutput | BaseException]:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        items, self._items = self._items, []
        return items


@dataclass
class SimConfig:
    model: str = "sim-llama-8b"
    profile: str = DEFAULT_PROFILE  # a name in services/engine_worker/policies/sim_profiles.yaml
    max_model_len: int = 8192
    max_num_seqs: int = 256  # vLLM 0.8 default
    max_num_batched_tokens: int = 8192  # vLLM 0.8 default for the OpenAI server
    kv_blocks_total: int | None = None  # None: the profile's
    kv_block_size: int = 16
    enable_prefix_caching: bool = True
    admit_full_prompt: bool = True  # vLLM's scheduler_reserve_full_isl
    kv_offloading_gib: float = 0.0  # host-memory KV tier, as vLLM's --kv-offloading-size (0: none)
    speedup: float = 1.0  # 0 = take no time
    divergence: float = 0.0  # answer quality: share of tokens that differ from the reference answer
    tokenizer: str | None = None  # a real tokenizer to count prompts with (llmbus.tokens); None: 4-char pseudo-tokens
    # Overrides of the profile's step-time coefficients (None: the profile's).
    step_base_us: float | None = None
    prefill_us_per_token: float | None = None
    decode_us_per_seq: float | None = None

    def resolve_profile(self) -> SimProfile:
        base = get_profile(self.profile)
        return SimProfile(
            name=base.name,
            model=base.model,
            gpu=base.gpu,
            step_base_us=base.step_base_us if self.step_base_us is None else self.step_base_us,
            prefill_us_per_token=base.prefill_us_per_token
            if self.prefill_us_per_token is None
            else self.prefill_us_per_token,
            decode_us_per_seq=base.decode_us_per_seq if self.decode_us_per_seq is None else self.decode_us_per_seq,
            kv_blocks_total=base.kv_blocks_total if self.kv_blocks_total is None else self.kv_blocks_total,
            kv_block_size=self.kv_block_size,
            kv_block_bytes=base.kv_block_bytes,
            host_link_gb_per_s=base.host_link_gb_per_s,
            tensor_parallel_size=base.tensor_parallel_size,
            vllm_version=base.vllm_version,
            source=base.source,
        )


class SimEngine:
    name = "sim"

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.profile = self.config.resolve_profile()
        self.model = self.config.model
        self.max_model_len = self.config.max_model_len
        self.max_num_seqs = self.config.max_num_seqs
        self.core = SimCore(
            self.profile,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_model_len=self.config.max_model_len,
            enable_prefix_caching=self.config.enable_prefix_caching,
            admit_full_prompt=self.config.admit_full_prompt,
            host_kv_blocks=self.profile.host_kv_blocks(self.config.kv_offloading_gib),
        )
        self._outboxes: dict[str, _Outbox] = {}
        self._step_task: asyncio.Task[None] | None = None
        self._clock_origin_s: float | None = None
        self._stopped = False

    # ---- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        self._clock_origin_s = asyncio.get_running_loop().time()
        self._stopped = False

    async def warmup(self) -> None:
        async for _ in self.generate(EngineRequest("warmup", "warm up", max_tokens=2)):
            pass
        self.core.reset_counters()

    async def stop(self) -> None:
        self._stopped = True
        if self._step_task is not None:
            self._step_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._step_task
            self._step_task = None
        for request_id in list(self._outboxes):
            await self.abort(request_id)

    # ---- requests ----------------------------------------------------------------

    def count_tokens(self, text: str) -> int:
        tokenizer = try_load(self.config.tokenizer)
        return tokenizer.count(text) if tokenizer is not None else pseudo_tokens(text)

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        reason = self.core.refusal(max(1, prompt_tokens), max_tokens)
        if reason is not None:
            raise AdmissionError(reason)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self._stopped:
            raise EngineDead("sim engine is stopped")
        # A fill-in-the-middle suffix is prompt like the prefix: it costs prefill and KV the same.
        prompt = request.prompt + (request.suffix or "")
        prompt_tokens = self.count_tokens(prompt) if self.config.tokenizer else None
        sim_request = SimRequest.from_text(
            request.request_id,
            prompt,
            request.max_tokens,
            request.seed,
            self.config.kv_block_size,
            prompt_tokens,
        )
        self.check_admission(sim_request.prompt_tokens, request.max_tokens)
        if request.request_id in self.core:
            raise EngineError(f"request {request.request_id!r} is already running")
        outbox = _Outbox(asyncio.get_running_loop())
        self._outboxes[request.request_id] = outbox
        self._sync_idle_clock()
        self.core.add(sim_request)
        self._ensure_stepping()
        answer = AnswerText(
            request.prompt, request.seed, self.config.divergence, self.model, reference_key=sim_request.content_key
        )
        stops = request.stop
        text = ""  # what was returned so far, kept only to look for stop strings in
        completion_tokens = 0  # as delivered: an abort can land after the core ran a step not yet delivered
        done = False
        try:
            while not done:
                for item in await outbox.take():
                    if isinstance(item, BaseException):
                        raise item
                    delta = answer.next_tokens(item.new_tokens)
                    finish_reason = item.finish_reason
                    if stops:
                        stop_at = _first_stop(text + delta, stops, len(text))
                        if stop_at is not None:
                            # Like vLLM: the answer ends before the stop string, which is not returned.
                            delta = (text + delta)[len(text) : stop_at]
                            finish_reason = "stop"
                            self.core.abort(request.request_id)
                        text += delta
                    completion_tokens += item.new_tokens
                    done = finish_reason is not None
                    yield EngineOutput(  # positional: this runs once per token
                        delta,
                        item.new_tokens,
                        item.prompt_tokens,
                        completion_tokens,
                        item.cached_prompt_tokens,
                        done,
                        finish_reason,
                        item.preemptions,
                    )
                    if done:
                        break
        finally:
            self._outboxes.pop(request.request_id, None)
            if not done:
                self.core.abort(request.request_id)  # the consumer went away mid-stream

    async def abort(self, request_id: str) -> None:
        final = self.core.abort(request_id)
        outbox = self._outboxes.get(request_id)
        if final is not None and outbox is not None:
            outbox.put(final)

    def stats(self) -> EngineStats:
        core = self.core
        pool = core.pool
        return EngineStats(
            num_requests_running=len(core.running),
            num_requests_waiting=len(core.waiting),
            kv_block_size=pool.block_size,
            kv_blocks_total=pool.num_blocks,
            kv_blocks_free=pool.num_free,
            kv_cache_usage_perc=pool.usage(),
            prefix_cache_queries_total=core.prefix_cache_queries_total,
            prefix_cache_hits_total=core.prefix_cache_hits_total,
            external_prefix_cache_hits_total=core.host_cache_hits_total,
            kv_offload_blocks_total=core.host.num_blocks if core.host is not None else 0,
            prompt_tokens_total=core.prompt_tokens_total,
            generation_tokens_total=core.generation_tokens_total,
            num_preemptions_total=core.preemptions_total,
        )

    # ---- the step loop -----------------------------------------------------------

    def _sync_idle_clock(self) -> None:
        # While idle, virtual time follows wall time x speedup, so arrivals keep their spacing.
        if self._step_task is None and self.config.speedup > 0 and self._clock_origin_s is not None:
            elapsed_s = asyncio.get_running_loop().time() - self._clock_origin_s
            self.core.advance_to(elapsed_s * 1e6 * self.config.speedup)

    def _ensure_stepping(self) -> None:
        if self._step_task is None or self._step_task.done():
            self._step_task = asyncio.create_task(self._step_loop(), name="sim-engine-steps")

    async def _step_loop(self) -> None:
        loop = asyncio.get_running_loop()
        speedup = self.config.speedup
        outboxes = self._outboxes
        deadline_s = loop.time()
        try:
            while self.core.has_work():
                result = self.core.step()
                if speedup > 0:
                    deadline_s = max(deadline_s + result.duration_us / 1e6 / speedup, loop.time() - _MAX_LAG_S)
                    await asyncio.sleep(max(0.0, deadline_s - loop.time()))
                else:
                    await asyncio.sleep(0)  # let consumers and new requests in between steps
                for out in result.outputs:
                    outbox = outboxes.get(out.request_id)
                    if outbox is not None:
                        outbox.put(out)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bug in the core must not leave streams hanging
            for outbox in outboxes.values():
                outbox.put(EngineDead(f"sim engine step failed: {exc!r}"))
        finally:
            self._step_task = None


def _first_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Index where the earliest stop string starts, if one ends in the new part of `text`."""
    positions = []
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at != -1:
            positions.append(at)
    return min(positions) if positions else None
