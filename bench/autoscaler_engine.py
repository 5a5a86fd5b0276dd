"""One worker's engine for the autoscaler's day-long replays: SimCore's step loop, fast-forwarded.

SimCore (services/engine_worker/adapters/engines/sim/core.py) prices every engine step with the
profile's step time — step_base + prefill_us_per_token x prompt tokens computed + decode_us_per_seq
x sequences decoding — and schedules each step as vLLM v1 does: running requests first (one token
per decode, the next chunk of an unfinished prefill), then waiting ones in order while the token
budget (`max_num_batched_tokens`) and the batch slots (`max_num_seqs`) last. A day of a fleet is
tens of millions of steps, too many to take one by one here, but most of them are alike: while no
prefill is in the batch and nobody new can join, every step decodes the same sequences and lasts
the same. This model takes such a run of steps as one segment that ends when the first sequence
finishes, and cuts it short at the step boundary after a request arrives. Steps with prefill are
taken one at a time, as SimCore takes them. Without a prefix cache and with the KV cache never
full (the replay's pools size it so), it produces SimCore's first-token and finish times
(tests/unit/test_autoscaler_engine.py holds it to that, step for step).

Time is in microseconds; the caller's event loop asks `segment_end_us` and calls `advance` then.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    computed: int = 0  # prompt tokens prefilled so far
    first_token_us: float | None = None
    first_step: int = 0  # the step (count) whose end gave the first token
    finish_us: float | None = None


@dataclass
class Finished:
    """What a segment's end produced: first tokens and finished requests, at `at_us`."""

    at_us: float
    first_tokens: list[EngineRequest] = field(default_factory=list)
    finished: list[EngineRequest] = field(default_factory=list)


class FastEngine:
    def __init__(self, profile: SimProfile, max_num_seqs: int, max_num_batched_tokens: int = 8192) -> None:
        self.base_us = profile.step_base_us
        self.prefill_us = profile.prefill_us_per_token
        self.decode_us = profile.decode_us_per_seq
        self.block_size = profile.kv_block_size
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.steps = 0  # steps completed
        self.waiting: deque[EngineRequest] = deque()
        self.prefilling: list[EngineRequest] = []  # admitted, prefill not finished (in the running batch)
        self._decoding: list[tuple[int, int, EngineRequest]] = []  # (finishing step, tie, request)
        self._tie = 0
        # The segment in progress: [start, start + n_steps x step) with its batch.
        self.segment_start_us = 0.0
        self.step_us = 0.0
        self.n_steps = 0
        self._chunks: list[tuple[EngineRequest, int]] = []  # prefill chunks of a one-step segment

    # ---- state ------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self.n_steps > 0

    @property
    def segment_end_us(self) -> float:
        return self.segment_start_us + self.n_steps * self.step_us

    @property
    def running(self) -> int:
        return len(self._decoding) + len(self.prefilling)

    def prefill_backlog_tokens(self) -> int:
        """Prompt tokens admitted and not yet prefilled (SimCore.prefill_backlog_tokens, without chunks in flight)."""
        return sum(r.prompt_tokens for r in self.waiting) + sum(r.prompt_tokens - r.computed for r in self.prefilling)

    def kv_tokens(self) -> int:
        """Tokens held in KV blocks (each request's prompt so far and the outputs it has)."""
        held = sum(r.computed for r in self.prefilling)
        for _, _, r in self._decoding:
            held += r.prompt_tokens + (self.steps - r.first_step + 1)
        return held

    # ---- inputs -----------------------------------------------------------------------

    def add(self, request: EngineRequest, now_us: float) -> None:
        """A request arrives: it joins the batch at the first step boundary at or after `now_us`."""
        self.waiting.append(request)
        if not self.busy:
            self._plan(now_us)
        elif not self._chunks and self.n_steps > 1:
            # A run of alike decode steps ends at the boundary the newcomer joins at.
            boundary = math.ceil((now_us - self.segment_start_us) / self.step_us - 1e-9)
            self.n_steps = max(1, min(self.n_steps, boundary))

    def advance(self) -> Finished:
        """End the segment in progress (its end is now) and start the next one."""
        end_us = self.segment_end_us
        out = Finished(end_us)
        self.steps += self.n_steps
        for request, tokens in self._chunks:
            request.computed += tokens
            if request.computed >= request.prompt_tokens:
                self.prefilling.remove(request)
                request.first_token_us = end_us
                request.first_step = self.steps
                out.first_tokens.append(request)
                # the first token is the step's own; the rest take one step each
                self._tie += 1
                heapq.heappush(self._decoding, (self.steps + request.output_tokens - 1, self._tie, request))
        while self._decoding and self._decoding[0][0] <= self.steps:
            _, _, request = heapq.heappop(self._decoding)
            request.finish_us = end_us
            out.finished.append(request)
        self._plan(end_us)
        return out

    # ---- scheduling -------------------------------------------------------------------

    def _plan(self, start_us: float) -> None:
        """The next segment: one step with prefill in it, or a run of decode steps up to the first finish."""
        self.segment_start_us = start_us
        self._chunks = []
        decodes = len(self._decoding)
        budget = self.budget - decodes
        prefill = 0
        for request in self.prefilling:
            if budget <= 0:
                break
            take = min(request.prompt_tokens - request.computed, budget)
            self._chunks.append((request, take))
            budget -= take
            prefill += take
        while self.waiting and budget > 0 and self.running < self.max_num_seqs:
            request = self.waiting.popleft()
            self.prefilling.append(request)
            take = min(request.prompt_tokens, budget)
            self._chunks.append((request, take))
            budget -= take
            prefill += take
        self.step_us = self.base_us + self.prefill_us * prefill + self.decode_us * decodes
        if self._chunks:
            self.n_steps = 1
        elif decodes:
            self.n_steps = self._decoding[0][0] - self.steps
        else:
            self.n_steps = 0  # idle
