"""The engines by registry name (llmbus.contract.plugins); heavy imports (vllm, httpx) only when chosen."""

from __future__ import annotations

from llmbus.contract.plugins import Registry
from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.engine import Engine

ENGINES: Registry[Engine] = Registry("engine")


def build_engine(settings: WorkerSettings) -> Engine:
    """The engine `settings.engine` names, configured from the worker's settings."""
    return ENGINES.build(settings.engine, settings=settings)


@ENGINES.register("sim")
def sim(settings: WorkerSettings) -> Engine:
    from llmbus_services.engine_worker.adapters.engines.sim.engine import SimConfig, SimEngine

    return SimEngine(
        SimConfig(
            model=settings.model,
            max_model_len=settings.sim_max_model_len or SimConfig.max_model_len,
            max_num_seqs=settings.sim_max_num_seqs or SimConfig.max_num_seqs,
            speedup=settings.sim_speedup,
            profile=settings.sim_profile,
            kv_blocks_total=settings.sim_kv_blocks_total,
            kv_offloading_gib=settings.sim_kv_offloading_gib,
            divergence=settings.sim_divergence,
            natural_answer_median_tokens=settings.sim_natural_answer_median_tokens,
            sample_unseeded=settings.sim_sample_unseeded,
            tokenizer=settings.tokenizer,
            max_loras=settings.sim_max_loras,
            max_lora_rank=settings.sim_max_lora_rank,
            lora_load_ms=settings.sim_lora_load_ms,
        )
    )


@ENGINES.register("vllm")
def vllm(settings: WorkerSettings) -> Engine:
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
            max_loras=settings.vllm_max_loras,
            max_lora_rank=settings.vllm_max_lora_rank,
            max_cpu_loras=settings.vllm_max_cpu_loras,
            warmup_iterations=settings.vllm_warmup_iterations,
            warmup_prompt_tokens=settings.vllm_warmup_prompt_tokens,
            engine_core_start_method=settings.vllm_engine_core_start_method,
            allow_untested_version=settings.vllm_allow_untested_version,
        )
    )


@ENGINES.register("onnx")
def onnx(settings: WorkerSettings) -> Engine:
    from llmbus_services.engine_worker.adapters.engines.onnx_engine import OnnxConfig, OnnxEngine

    return OnnxEngine(
        OnnxConfig(
            model=settings.model,
            model_path=settings.onnx_model_path,
            max_model_len=settings.onnx_max_model_len,
            max_num_seqs=settings.onnx_max_num_seqs,
            ignore_eos=settings.onnx_ignore_eos,
        )
    )


@ENGINES.register("openai-http")
def openai_http(settings: WorkerSettings) -> Engine:
    from llmbus_services.engine_worker.adapters.engines.openai_http import OpenAIHttpEngine
    from llmbus_services.engine_worker.adapters.engines.openai_http_config import openai_config

    return OpenAIHttpEngine(openai_config(settings))
