"""Pure, virtual-time core of the sim engine: vLLM v1's scheduler step loop, simulated.

Each `step()` schedules one continuous batch the way vLLM v1's Scheduler.schedule()
does (running requests first — decodes and unfinished prefill chunks — then waiting
requests with the token budget left, chunked prefill, preemption by recompute when KV
blocks run out), prices it with the profile's calibrated step time, advances the
virtual clock by that duration and returns what every request produced. No asyncio,
no broker: the async engine and the benchmarks drive it.

With `host_kv_blocks` it also keeps vLLM's native CPU offloading tier (HostKvTier): each
computed block is stored in host memory too, and a waiting request whose prefix continues
there past the GPU's cache has those blocks loaded over the host link (one copy at a time,
overlapped with the steps) and waits for them, as vLLM's WAITING_FOR_REMOTE_KVS, instead of
recomputing them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from llmbus.tokens import cache_scope, prefix_block_hashes, pseudo_tokens
from llmbus_services.engine_worker.adapters.engines.sim.kv_cache import BlockPool, HostKvTier
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile
from llmbus_services.engine_worker.adapters.engines.sim.text import content_key


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    # Chained hashes of the prompt's full blocks (llmbus.tokens.prefix_block_hashes).
    prompt_block_hashes: tuple[str, ...] = ()
    # Names what the request generates: equal keys → equal output tokens, so the blocks
    # past the hashed prompt blocks are identified by (content_key, block index).
    # None: the request id (nothing shared).
    content_key: str | None = None

    @classmethod
    def from_text(
        cls,
        request_id: str,
        prompt: str,
        max_tokens: int,
        seed: int | None = None,
        block_size: int = 16,
        prompt_tokens: int | None = None,
        cache_salt: str = "",
        adapter: str | None = None,
    ) -> SimRequest:
        """`prompt_tokens`: a real tokenizer's count; None: the sim's own pseudo-tokens (4 characters).
        `cache_salt`: as vLLM's, its blocks are shared only with requests of the same salt (a tenant's);
        `adapter`: a LoRA adapter's blocks are its own too (its KV is not its base model's, as in vLLM)."""
        scope = cache_scope(cache_salt, adapter)
        tokens = max(1, pseudo_tokens(prompt) if prompt_tokens is None else prompt_tokens)  # BOS at least
        return cls(
            request_id=request_id,
            prompt_tokens=tokens,
            max_tokens=max_tokens,
            # never more hashed blocks than the prompt's tokens fill
            prompt_block_hashes=tuple(
                prefix_block_hashes(prompt, block_size, tokens // block_size, cache_salt, adapter)
            ),
            content_key=content_key(f"{scope}|{prompt}" if scope else prompt, seed),
        )


@dataclass(slots=True)  # not frozen: one is made per token, and frozen ones cost ~4x to make
class RequestOutput:
    request_id: str
    new_tokens: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int  # of which host_loaded_tokens came from the host tier
    host_loaded_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None  # "length" | "abort"
    preemptions: int = 0  # times this request lost its KV blocks so far (recomputed after)


@dataclass(frozen=True, slots=True)
class StepResult:
    start_us: float
    duration_us: float
    prefill_tokens: int  # uncached prompt (or recomputed) tokens computed in this step
    decode_seqs: int
    outputs: list[RequestOutput] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # request id → tokens computed

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


class _Seq:
    """Scheduler state of one request (vLLM's Request: computed tokens, output tokens, blocks)."""

    __slots__ = (
        "arrival_us",
        "blocks",
        "cached_prompt_tokens",
        "host_loaded_tokens",
        "key",
        "num_computed",
        "num_hashed_blocks",
        "num_output",
        "num_preemptions",
        "ready_us",
        "req",
        "scheduled_once",
    )

    def __init__(self, req: SimRequest, arrival_us: float) -> None:
        self.req = req
        self.key = req.content_key if req.content_key is not None else req.request_id
        self.arrival_us = arrival_us
        self.num_computed = 0
        self.num_output = 0
        self.num_preemptions = 0
        self.blocks: list[int] = []
        self.num_hashed_blocks = 0
        self.cached_prompt_tokens = 0
        self.host_loaded_tokens = 0
        self.scheduled_once = False
        self.ready_us = 0.0  # when its host-tier blocks are loaded (while in SimCore.loading)

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.num_output

    def block_hash(self, index: int) -> str:
        hashes = self.req.prompt_block_hashes
        return hashes[index] if index < len(hashes) else f"{self.key}#{index}"


class SimCore:
    def __init__(
        self,
        profile: SimProfile,
        *,
        kv_blocks_total: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int = 8192,
        enable_prefix_caching: bool = True,
        admit_full_prompt: bool = True,
        host_kv_blocks: int = 0,
    ) -> None:
        self.profile = profile
        self.block_size = profile.kv_block_size
        self.pool = BlockPool(kv_blocks_total or profile.kv_blocks_total, self.block_size)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        # Admit a waiting request only if its whole prompt fits in the free blocks, not just
        # its first chunk (vLLM's scheduler_reserve_full_isl, on by default in recent vLLM):
        # avoids admitting prefills that would soon have to be preempted.
        self.admit_full_prompt = admit_full_prompt
        self.host = HostKvTier(host_kv_blocks) if host_kv_blocks > 0 and enable_prefix_caching else None
        self._host_load_us = profile.host_load_us_per_block if self.host is not None else 0.0
        self._host_link_free_us = 0.0
        self.now_us = 0.0
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.loading: list[_Seq] = []  # blocks being copied in from the host tier
        self._seqs: dict[str, _Seq] = {}
        self.steps_total = 0
        self.prefix_cache_queries_total = 0  # tokens looked up
        self.prefix_cache_hits_total = 0  # tokens found in the GPU cache
        self.host_cache_hits_total = 0  # tokens loaded from the host tier
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.preemptions_total = 0

    # ---- requests ----------------------------------------------------------------

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request could never run on this engine, or None."""
        if max_tokens < 1:
            return f"max_tokens {max_tokens} < 1"
        if prompt_tokens + max_tokens > self.max_model_len:
            return f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}"
        blocks = -(-(prompt_tokens + max_tokens) // self.block_size)
        if blocks > self.pool.num_blocks:
            return f"needs {blocks} KV blocks, the cache has {self.pool.num_blocks}"
        return None

    def add(self, request: SimRequest, arrival_us: float | None = None) -> None:
        if request.request_id in self._seqs:
            raise ValueError(f"request {request.request_id!r} is already in the engine")
        reason = self.refusal(request.prompt_tokens, request.max_tokens)
        if reason is not None:
            raise ValueError(reason)
        seq = _Seq(request, self.now_us if arrival_us is None else arrival_us)
        self._seqs[request.request_id] = seq
        self.waiting.append(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        if seq in self.running:
            self.running.remove(seq)
            self._free(seq)
        elif seq in self.loading:
            self.loading.remove(seq)
            self._free(seq)
        else:
            self.waiting.remove(seq)
        return self._output(seq, 0, "abort")

    def cached_tokens(self, request: SimRequest) -> int:
        """Prompt tokens of `request` the prefix cache would serve right now (nothing changes)."""
        return len(self._lookup(_Seq(request, self.now_us))) * self.block_size

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._seqs

    def reset_counters(self) -> None:
        """Zero the totals (after a warm-up), keeping the requests and the cache."""
        self.steps_total = self.prefix_cache_queries_total = self.prefix_cache_hits_total = 0
        self.host_cache_hits_total = 0
        self.prompt_tokens_total = self.generation_tokens_total = self.preemptions_total = 0

    def has_work(self) -> bool:
        return bool(self._seqs)

    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens admitted and not yet computed: the waiting (and loading) requests' whole
        remainder, and running requests still in a chunked prefill (a decode has one token left)."""
        backlog = sum(seq.num_tokens - seq.num_computed for seq in self.waiting)
        backlog += sum(seq.num_tokens - seq.num_computed for seq in self.loading)
        for seq in self.running:
            left = seq.num_tokens - seq.num_computed
            if left > 1 or seq.num_output == 0:
                backlog += left
        return backlog

    def advance_to(self, t_us: float) -> None:
        """Let idle virtual time pass (the clock never goes back)."""
        self.now_us = max(self.now_us, t_us)

    # ---- one engine step -----------------------------------------------------------

    def step(self) -> StepResult:
        start_us = self.now_us
        if not self._seqs:
            return StepResult(start_us, 0.0, 0, 0, kv_usage=self.pool.usage())
        if self.loading:
            self._finish_loads()
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[_Seq, int]] = []
        preempted: list[str] = []

        # 1. Running requests, in order: one token for a decode, a chunk for a prefill.
        running = self.running
        block_size = self.block_size
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            if seq.num_computed + num_new <= len(seq.blocks) * block_size:
                # Room in its blocks already (most decodes): what _allocate would say, without the call.
                self._cache_full_blocks(seq, seq.num_computed + num_new)
                scheduled.append((seq, num_new))
                budget -= num_new
                i += 1
                continue
            while not self._allocate(seq, seq.num_computed, num_new, []):
                # Out of KV blocks: preempt the youngest running request (recompute later).
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.req.request_id)
                if victim is seq:
                    break
            else:
                self._cache_full_blocks(seq, seq.num_computed + num_new)
                scheduled.append((seq, num_new))
                budget -= num_new
                i += 1
                continue
            break

        # 2. Waiting requests (FCFS) with the budget left, unless this step had to preempt.
        waiting = self.waiting
        while not preempted and waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = waiting[0]
            if seq.blocks:  # back from a host-tier load: its prefix is in place and counted
                num_computed = seq.num_computed
                num_new = min(seq.num_tokens - num_computed, budget)
                if not self._allocate(seq, num_computed, num_new, []):
                    break
                waiting.popleft()
                running.append(seq)
                self._cache_full_blocks(seq, num_computed + num_new)
                scheduled.append((seq, num_new))
                budget -= num_new
                continue
            hits = self._lookup(seq)
            num_computed = len(hits) * self.block_size
            to_load = self._host_lookup(seq, len(hits))
            num_new = min(seq.num_tokens - num_computed, budget)
            if self.admit_full_prompt and not self._fits(seq.num_tokens, hits):
                break
            if not self._allocate(seq, num_computed, to_load if to_load else num_new, hits):
                break
            waiting.popleft()
            seq.num_computed = num_computed + to_load
            seq.num_hashed_blocks = len(hits)
            if self.enable_prefix_caching:
                self.prefix_cache_queries_total += seq.num_tokens
                self.prefix_cache_hits_total += num_computed
                self.host_cache_hits_total += to_load
            if not seq.scheduled_once:
                seq.scheduled_once = True
                seq.cached_prompt_tokens = min(num_computed + to_load, seq.req.prompt_tokens)
                seq.host_loaded_tokens = min(to_load, seq.cached_prompt_tokens)
            if to_load:
                self._start_load(seq, to_load // self.block_size)
                continue
            running.append(seq)
            self._cache_full_blocks(seq, num_computed + num_new)
            scheduled.append((seq, num_new))
            budget -= num_new

        if not scheduled:
            if self.loading:
                # Nothing to compute until a host-tier load lands (its blocks are held): idle till then.
                self.now_us = max(start_us, min(s.ready_us for s in self.loading))
                return StepResult(
                    start_us,
                    self.now_us - start_us,
                    0,
                    0,
                    preempted=preempted,
                    num_running=len(self.running),
                    num_waiting=len(self.waiting) + len(self.loading),
                    kv_usage=self.pool.usage(),
                )
            if not self.running and self._release_waiting_blocks():
                return self.step()  # the same instant, with their blocks free (and still cached)
            raise RuntimeError("sim core: work pending but nothing could be scheduled")

        # 3. Run the batch, collect what each request produced, and price it (one pass: what a
        # request produces does not depend on the step's duration).
        prefill_tokens = 0
        decode_seqs = 0
        outputs: list[RequestOutput] = []
        finished_any = False
        for seq, num_new in scheduled:
            num_tokens = seq.req.prompt_tokens + seq.num_output
            if seq.num_output > 0 and seq.num_computed == num_tokens - 1:
                decode_seqs += 1
            else:
                prefill_tokens += num_new
            seq.num_computed += num_new
            if seq.num_computed < num_tokens:
                continue  # a prefill chunk short of the end: no token yet
            seq.num_output += 1
            self.generation_tokens_total += 1
            if seq.num_output == 1:
                self.prompt_tokens_total += seq.req.prompt_tokens
            if seq.num_output >= seq.req.max_tokens or num_tokens + 1 >= self.max_model_len:
                finished_any = True
                del self._seqs[seq.req.request_id]
                self._free(seq)
                outputs.append(self._output(seq, 1, "length"))
            else:
                outputs.append(self._output(seq, 1, None))
        duration_us = self.profile.step_us(prefill_tokens, decode_seqs)
        self.now_us = start_us + duration_us
        self.steps_total += 1
        if finished_any:
            self.running = [s for s in running if s.req.request_id in self._seqs]
        return StepResult(
            start_us,
            duration_us,
            prefill_tokens,
            decode_seqs,
            outputs,
            preempted,
            len(self.running),
            len(self.waiting) + len(self.loading),
            self.pool.usage(),
            {seq.req.request_id: n for seq, n in scheduled},
        )

    # ---- KV blocks -----------------------------------------------------------------

    def _lookup(self, seq: _Seq) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        # At least the last token is always computed, so it can never be a hit (as in vLLM).
        max_hit_blocks = (seq.num_tokens - 1) // self.block_size
        return self.pool.lookup(seq.block_hash(j) for j in range(max_hit_blocks))

    def _host_lookup(self, seq: _Seq, gpu_hit_blocks: int) -> int:
        """Tokens of `seq`'s prefix past the GPU hits that the host tier can load (whole blocks)."""
        if self.host is None:
            return 0
        max_hit_blocks = (seq.num_tokens - 1) // self.block_size
        found = self.host.lookup(seq.block_hash(j) for j in range(gpu_hit_blocks, max_hit_blocks))
        return found * self.block_size

    def _start_load(self, seq: _Seq, blocks: int) -> None:
        # One host-to-GPU copy at a time on the link, overlapped with the engine's steps.
        start = max(self.now_us, self._host_link_free_us)
        seq.ready_us = self._host_link_free_us = start + blocks * self._host_load_us
        self.loading.append(seq)

    def _finish_loads(self) -> None:
        """Loads that landed by now: their blocks join the prefix cache, the requests wait again in front."""
        landed = [s for s in self.loading if s.ready_us <= self.now_us]
        if not landed:
            return
        self.loading = [s for s in self.loading if s.ready_us > self.now_us]
        for seq in reversed(landed):
            self._cache_full_blocks(seq, seq.num_computed)
            self.waiting.appendleft(seq)

    def _release_waiting_blocks(self) -> bool:
        """Break a stall: requests back from a host-tier load hold their blocks while they wait, and
        when nothing runs and the head of the queue cannot get blocks, they give theirs up (preempted,
        as vLLM would). The blocks stay cached, so their prefix is still a hit when they come back."""
        holders = [seq for seq in self.waiting if seq.blocks]
        for seq in holders:
            self._free(seq)
            seq.num_computed = 0
            seq.num_hashed_blocks = 0
            seq.num_preemptions += 1
            self.preemptions_total += 1
        return bool(holders)

    def _fits(self, num_tokens: int, hits: list[int]) -> bool:
        needed_blocks = -(-num_tokens // self.block_size) - len(hits)
        return needed_blocks <= self.pool.num_free - (self.pool.num_evictable(hits) if hits else 0)

    def _allocate(self, seq: _Seq, num_computed: int, num_new: int, hits: list[int]) -> bool:
        """Give `seq` blocks for `num_computed + num_new` tokens (reusing `hits`), or say no."""
        needed_blocks = -(-(num_computed + num_new) // self.block_size)
        to_allocate = needed_blocks - len(seq.blocks) - len(hits)
        pool = self.pool
        # Cache hits sitting in the free queue stop being free once this request holds them.
        if to_allocate > pool.num_free - (pool.num_evictable(hits) if hits else 0):
            return False
        if hits:
            pool.touch(hits)
            seq.blocks = list(hits)
        if to_allocate > 0:
            seq.blocks.extend(pool.allocate(to_allocate))
        return True

    def _cache_full_blocks(self, seq: _Seq, num_tokens: int) -> None:
        # Like vLLM, blocks are published when scheduled: a later request in the same batch
        # can already share them, since this forward pass fills them before it reads them.
        if not self.enable_prefix_caching or num_tokens // self.block_size <= seq.num_hashed_blocks:
            return  # nothing newly full (a decode within its block)
        full = min(num_tokens // self.block_size, len(seq.blocks))
        host = self.host
        for j in range(seq.num_hashed_blocks, full):
            block_hash = seq.block_hash(j)
            self.pool.cache_block(seq.blocks[j], block_hash)
            if host is not None:
                host.store(block_hash)  # offloaded as it is computed (async in vLLM)
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    def _free(self, seq: _Seq) -> None:
        self.pool.free(seq.blocks)
        seq.blocks = []

    def _preempt(self, seq: _Seq) -> None:
        self._free(seq)
        seq.num_computed = 0
        seq.num_hashed_blocks = 0
        self.waiting.appendleft(seq)
        seq.num_preemptions += 1
        self.preemptions_total += 1

    def _output(self, seq: _Seq, new_tokens: int, finish_reason: str | None) -> RequestOutput:
        return RequestOutput(
            seq.req.request_id,
            new_tokens,
            seq.req.prompt_tokens,
            seq.num_output,
            seq.cached_prompt_tokens,
            seq.host_loaded_tokens,
            finish_reason is not None,
            finish_reason,
            seq.num_preemptions,
        )
