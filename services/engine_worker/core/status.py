"""Heartbeat content: the engine's gauges under vLLM's names, and token rates (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import WorkerState, WorkerStatus
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import Engine, EngineStats, adapter_slots, honoured_features


@dataclass
class RateTracker:
    """Tokens per second between two heartbeats, from the engine's monotonic counters."""

    last_time_s: float | None = None
    last_prompt_tokens: int = 0
    last_generation_tokens: int = 0

    def rates(self, stats: EngineStats, now_s: float) -> tuple[float, float]:
        if self.last_time_s is None or now_s <= self.last_time_s:
            prompt_rate = gen_rate = 0.0
        else:
            elapsed = now_s - self.last_time_s
            prompt_rate = max(0, stats.prompt_tokens_total - self.last_prompt_tokens) / elapsed
            gen_rate = max(0, stats.generation_tokens_total - self.last_generation_tokens) / elapsed
        self.last_time_s = now_s
        self.last_prompt_tokens = stats.prompt_tokens_total
        self.last_generation_tokens = stats.generation_tokens_total
        return prompt_rate, gen_rate


def cold_start_phases(
    startup_s: float, engine_start_s: float, warmup_s: float, engine_phases: dict[str, float]
) -> dict[str, float]:
    """The worker's phases in the order they ran, name → seconds: `startup`, the engine's start (`engine_start`,
    or the engine's own split of it where it has one: vllm's import, config, engine_process, weights, kv_pool,
    kernels), then `warmup` (dummy inference). services/engine_worker/README.md, "Cold start", lists them."""
    phases = {"startup": round(startup_s, 3)}
    start_detail = {k: v for k, v in engine_phases.items() if k != "warmup"}
    phases.update(start_detail or {"engine_start": round(engine_start_s, 3)})
    phases["warmup"] = round(warmup_s, 3)
    return phases


def build_status(
    settings: WorkerSettings,
    engine: Engine,
    state: WorkerState,
    dispatch_topic: str,
    rates: RateTracker,
    now_s: float,
    *,
    cold_start_s: float | None,
    started_at_ms: int,
    cold_start_phases_s: dict[str, float] | None = None,
    model_format: str | None = None,
    gpu_healthy: bool = True,
    ecc_uncorrected: int = 0,
    formats_supported: list[str] | None = None,
    oldest_running_started_at_ms: int | None = None,
) -> WorkerStatus:
    stats = engine.stats()
    slots = adapter_slots(engine)
    prompt_rate, gen_rate = rates.rates(stats, now_s)
    hits = stats.prefix_cache_hits_total + stats.external_prefix_cache_hits_total
    hit_rate = hits / stats.prefix_cache_queries_total if stats.prefix_cache_queries_total else 0.0
    return WorkerStatus(
        worker_id=settings.worker_id,
        node_id=settings.node_id,
        state=state,
        engine=engine.name,
        engine_features=sorted(honoured_features(engine)),
        models=[engine.model],
        model_version=settings.model_version,
        model_format=model_format,
        dispatch_topic=dispatch_topic,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        kv_block_size=stats.kv_block_size,
        kv_blocks_total=stats.kv_blocks_total,
        kv_blocks_free=stats.kv_blocks_free,
        kv_offload_blocks_total=stats.kv_offload_blocks_total,
        kv_cache_usage_perc=min(1.0, max(0.0, stats.kv_cache_usage_perc)),
        num_requests_running=stats.num_requests_running,
        num_requests_waiting=stats.num_requests_waiting,
        prefill_backlog_tokens=max(0, stats.prefill_backlog_tokens),
        oldest_running_started_at_ms=oldest_running_started_at_ms,
        prefix_cache_hit_rate=min(1.0, hit_rate),
        generation_tokens_per_s=round(gen_rate, 3),
        prompt_tokens_per_s=round(prompt_rate, 3),
        cold_start_s=cold_start_s,
        cold_start_phases_s=cold_start_phases_s or {},
        gpu_healthy=gpu_healthy,
        ecc_uncorrected=ecc_uncorrected,
        formats_supported=formats_supported or [],
        max_loras=slots.max_loras if slots is not None else 0,
        max_lora_rank=slots.max_lora_rank if slots is not None else 0,
        lora_adapters=slots.loaded if slots is not None else [],
        started_at_ms=started_at_ms,
    )
