"""The `sim` engine: SimCore (vLLM-like scheduling in virtual time) behind the Engine protocol.

One background task steps the core while there is work and sleeps each step's
simulated duration / `speedup` (0: no sleeping, as fast as the CPU goes); the outputs
of a step reach each request's `generate()` iterator through its own outbox once the
step's time has passed, like tokens leaving a real engine after the forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

from llmbus.contract.messages import LoraAdapter, tools_text
from llmbus.tokens import count_tokens
from llmbus_services.engine_worker.adapters.engines.sim.core import RequestOutput, SimCore, SimRequest
from llmbus_services.engine_worker.adapters.engines.sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from llmbus_services.engine_worker.adapters.engines.sim.text import AnswerText, content_key, natural_answer_tokens
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRejected,
    answer_room,
)
from llmbus_services.engine_worker.core.lora_slots import AdapterRefused, AdapterSlots
from llmbus_services.engine_worker.core.stops import first_stop

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
    # A request without max_tokens ends where a chat model's answer would (finish "stop"), at a length drawn
    # around this median (text.natural_answer_tokens), instead of writing the whole window.
    natural_answer_median_tokens: int = 129  # data/traces/azure-llm-2023-conv.csv's median answer
    # A request sampled without a seed (temperature > 0) draws a fresh answer on every run, as a model samples;
    # False: the same prompt (and seed) gives the same answer whatever the temperature (reproducible tests,
    # shadow comparisons between sim models).
    sample_unseeded: bool = False
    # The model's tokenizer (llmbus.tokens); None: the request's (the catalog's), else llmbus.tokens' estimate.
    tokenizer: str | None = None
    # Overrides of the profile's step-time coefficients (None: the profile's).
    step_base_us: float | None = None
    prefill_us_per_token: float | None = None
    decode_us_per_seq: float | None = None
    # LoRA adapters: slots (0: none), their largest rank, and the time loading one takes (its files read,
    # its weights copied to the GPU), at `speedup` like the steps.
    max_loras: int = 0
    max_lora_rank: int = 16
    lora_load_ms: float = 50.0

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
        cfg = self.config
        self.lora = AdapterSlots(cfg.max_loras, cfg.max_lora_rank, cfg.model) if cfg.max_loras > 0 else None
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

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        """With the worker's tokenizer, else the catalog's for the model (the router's), else the router's
        estimate: the sim's usage is the count the router made of the same prompt."""
        return count_tokens(text, self.config.tokenizer or tokenizer)

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        reason = self.core.refusal(max(1, prompt_tokens), max_tokens)
        if reason is not None:
            raise AdmissionError(reason)

    def can_continue(self, request: EngineRequest) -> bool:
        return True  # a cut answer's next leg goes on with the answer's token stream

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self._stopped:
            raise EngineDead("sim engine is stopped")
        # A fill-in-the-middle suffix is prompt like the prefix: it costs prefill and KV the same.
        prompt = request.prompt + (request.suffix or "")
        prompt_tokens = self.count_tokens(prompt, request.tokenizer)
        if request.tools:
            prompt_tokens += self.count_tokens(tools_text(request.tools), request.tokenizer)
        seed = request.seed
        if seed is None and self.config.sample_unseeded and (request.temperature or 0.0) > 0.0:
            seed = random.getrandbits(63)  # sampled: this run's own answer
        continuation, read = request.continuation, prompt
        so_far = continuation.completion_tokens if continuation is not None else 0
        if continuation is not None:  # the answer so far is prompt now: prefill and KV like the rest
            read, prompt_tokens = prompt + continuation.text, prompt_tokens + so_far
        max_tokens = answer_room(prompt_tokens, request.max_tokens, request.max_tokens_auto, self.max_model_len)
        adapter = request.adapter.name if request.adapter is not None else None
        sim_request = SimRequest.from_text(
            request.request_id,
            read,
            max_tokens,
            seed,
            self.config.kv_block_size,
            prompt_tokens,
            request.cache_salt,
            adapter,  # an adapter's KV is its own (as in vLLM)
        )
        self.check_admission(sim_request.prompt_tokens, max_tokens)
        # The text, and where it ends, follow the prompt alone (the same for every tenant); the KV blocks
        # follow the salt too (sim_request.content_key); with a sampled seed, the same stream whichever leg this is.
        text_key = content_key(prompt, seed)
        ends_on_its_own = False  # the answer stops before max_tokens, as a model's end-of-sequence token ends it
        if request.max_tokens_auto:
            natural = natural_answer_tokens(text_key, self.config.natural_answer_median_tokens) - so_far
            if natural < max_tokens:
                sim_request, ends_on_its_own = dataclasses.replace(sim_request, max_tokens=max(1, natural)), True
        if request.request_id in self.core:
            raise EngineError(f"request {request.request_id!r} is already running")
        if request.adapter is not None:
            await self._load_adapter(request.adapter)
        outbox = _Outbox(asyncio.get_running_loop())
        self._outboxes[request.request_id] = outbox
        self._sync_idle_clock()
        self.core.add(sim_request)
        self._ensure_stepping()
        # An adapter answers its own text (a fine-tune of the base), the same for every tenant too.
        model_key = adapter or self.model
        answer = AnswerText(request.prompt, seed, self.config.divergence, model_key, reference_key=text_key)
        if continuation is not None and seed == request.seed:
            answer.next_tokens(so_far)  # the same stream, past the tokens already sent: one answer either way
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
                    if finish_reason == "length" and ends_on_its_own:
                        finish_reason = "stop"
                    if stops:
                        stop_at = first_stop(text + delta, stops, len(text))
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

    async def _load_adapter(self, adapter: LoraAdapter) -> None:
        if self.lora is None:
            raise RequestRejected(f"{self.model!r} is served without LoRA adapters ({adapter.name!r} asked)")
        try:
            use = self.lora.use(adapter)
        except AdapterRefused as refused:
            raise RequestRejected(str(refused)) from refused
        if use.loads and self.config.speedup > 0:
            await asyncio.sleep(self.config.lora_load_ms / 1000 / self.config.speedup)

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
            prefill_backlog_tokens=core.prefill_backlog_tokens(),
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
