"""Builds the configured engine; heavy imports (vllm, httpx) only when chosen."""

from __future__ import annotations

from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import Engine


def build_engine(settings: WorkerSettings) -> Engine:
    if settings.engine == "sim":
        from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine

        return SimEngine(
            SimConfig(
                model=settings.model,
                max_model_len=settings.sim_max_model_len,
                max_num_seqs=settings.sim_max_num_seqs,
                speedup=settings.sim_speedup,
                profile=settings.sim_profile,
                kv_blocks_total=settings.sim_kv_blocks_total,
                kv_offloading_gib=settings.sim_kv_offloading_gib,
                divergence=settings.sim_divergence,
                tokenizer=settings.tokenizer,
            )
        )
    if settings.engine == "vllm":
        from llmbus_services.engine_worker.adapters.engines.vllm_engine import VllmConfig, VllmEngine

        return VllmEngine(
            VllmConfig(
                model=settings.model,
                model_path=settings.vllm_model_path,
                dtype=settings.vllm_dtype,
                quantization=settings.vllm_quantization,
                max_model_len=settings.vllm_max_model_len,
                max_num_seqs=settings.vllm_max_num_seqs,
                enforce_eager=settings.vllm_enforce_eager,
                gpu_memory_utilization=settings.vllm_gpu_memory_utilization,
                cpu_kvcache_space_gib=settings.vllm_cpu_kvcache_space_gib,
                enable_prefix_caching=settings.vllm_enable_prefix_caching,
                ignore_eos=settings.vllm_ignore_eos,
                tensor_parallel_size=settings.vllm_tensor_parallel_size,
                pipeline_parallel_size=settings.vllm_pipeline_parallel_size,
                scheduling_policy=settings.vllm_scheduling_policy,
                block_size=settings.vllm_block_size,
                max_num_batched_tokens=settings.vllm_max_num_batched_tokens,
                kv_offloading_gib=settings.vllm_kv_offloading_gib,
                otlp_traces_endpoint=settings.vllm_otlp_traces_endpoint,
                tool_call_parser=settings.vllm_tool_call_parser,
                fim_format=settings.vllm_fim_format,
                warmup_iterations=settings.vllm_warmup_iterations,
                warmup_prompt_tokens=settings.vllm_warmup_prompt_tokens,
                engine_core_start_method=settings.vllm_engine_core_start_method,
            )
        )
    from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpEngine
    from llmbus_services.engine_worker.adapters.engines.openai_http_config import openai_config

    return OpenAIHttpEngine(openai_config(settings))
