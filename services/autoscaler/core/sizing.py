"""Pool size from the work in tokens: one worker's engine time, its batch slots, and bursts of prompts.

A worker runs vLLM-style continuous batching: each engine step costs
    step_base_us + prefill_us_per_token x prompt tokens computed + decode_us_per_seq x sequences decoding
(the sim engine's profiles and BLIS's fitted coefficients use exactly this model). A request adds
`work_s` = prompt x prefill + output x decode of engine time beyond the steps' base cost, so a
worker taking `rate` requests per second is busy with tokens for rho = rate x work_s of each
second, and its steps stretch to step_base / (1 - rho): the batch is the same work spread over
fewer, longer steps. With n workers the pool must keep, for the load it expects:
- rho under `max_utilisation` (prefill and decode tokens both count: a prefill-heavy pool is sized
  by its prompts, a decode-heavy one by its outputs);
- the sequences decoding at once (Little's law: rate x output tokens x step time) within the
  workers' batch slots (max_num_seqs) at `slot_utilisation`;
- bursts of prompts: over the windows of the recent past (their prompt tokens as a ratio to the
  mean, core/workload.py), the share of requests whose window holds more prompt work than the
  pool can prefill within the window plus the TTFT target, with the engine time the steady load
  leaves free, under `burst_late_share` — the part of the SLO's budget bursts may spend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from llmbus.contract.config_file import StrictModel
from llmbus_services.autoscaler.core.workload import BurstProfile


class EngineModel(StrictModel):
    """One worker's step time (microseconds): the pool's model on its GPUs, as calibrated."""

    step_base_us: float = Field(gt=0)
    prefill_us_per_token: float = Field(gt=0)
    decode_us_per_seq: float = Field(ge=0)

    def work_s(self, prompt_tokens: float, output_tokens: float) -> float:
        """Engine seconds one request costs beyond the steps' base: its prefill and its decodes."""
        return (prompt_tokens * self.prefill_us_per_token + output_tokens * self.decode_us_per_seq) / 1e6

    def prefill_s(self, tokens: float) -> float:
        return tokens * self.prefill_us_per_token / 1e6


@dataclass(frozen=True)
class TokenLoad:
    """The load a pool is sized for: a rate and its requests' mean tokens, and how its prompts burst."""

    rate_per_s: float
    prompt_tokens: float
    output_tokens: float
    bursts: BurstProfile = field(default_factory=BurstProfile)
    window_s: float = 5.0  # the windows the bursts were measured over

    def scaled(self, factor: float) -> TokenLoad:
        return TokenLoad(self.rate_per_s * factor, self.prompt_tokens, self.output_tokens, self.bursts, self.window_s)


@dataclass(frozen=True)
class Headroom:
    max_utilisation: float  # of a worker's engine time spent on tokens
    slot_utilisation: float  # of its batch slots
    ttft_target_s: float
    burst_late_share: float = 0.005  # of requests, late because their window's prompts outran the pool


def fits(n: int, load: TokenLoad, engine: EngineModel, slots: int, headroom: Headroom) -> bool:
    """Whether `n` workers carry `load` within the headroom."""
    if load.rate_per_s <= 0:
        return True
    if n <= 0:
        return False
    per_worker = load.rate_per_s / n
    rho = per_worker * engine.work_s(load.prompt_tokens, load.output_tokens)
    if rho >= headroom.max_utilisation:
        return False
    step_s = engine.step_base_us / 1e6 / (1 - rho)
    decoding = per_worker * load.output_tokens * step_s
    if decoding > slots * headroom.slot_utilisation:
        return False
    mean_window_s = engine.prefill_s(load.rate_per_s * load.prompt_tokens * load.window_s)
    if mean_window_s <= 0:
        return True
    capacity_s = n * (load.window_s + headroom.ttft_target_s) * (1 - rho)
    return load.bursts.late_share(capacity_s / mean_window_s) <= headroom.burst_late_share


def workers_for(load: TokenLoad, engine: EngineModel, slots: int, headroom: Headroom, max_replicas: int) -> int:
    """Fewest workers that carry `load` (`max_replicas` when even they do not); 0 for no load."""
    if load.rate_per_s <= 0:
        return 0
    # The utilisation bound alone gives a floor; more workers are tried from there.
    floor = load.rate_per_s * engine.work_s(load.prompt_tokens, load.output_tokens) / headroom.max_utilisation
    n = max(1, int(floor))
    while n < max_replicas and not fits(n, load, engine, slots, headroom):
        n += 1
    return min(n, max_replicas)


def workers_for_present(
    backlog_tokens: float, in_flight: int, engine: EngineModel, slots: int, headroom: Headroom
) -> int:
    """Workers the work already in the pool needs: its prefill backlog done within the TTFT target,
    its requests within the batch slots."""
    by_prefill = engine.prefill_s(backlog_tokens) / headroom.ttft_target_s
    by_slots = in_flight / (slots * headroom.slot_utilisation) if slots else 0.0
    need = max(by_prefill, by_slots)
    return int(need) + (need > int(need))
