"""The `vllm` engine: vLLM's AsyncLLM (v1 engine) in this process, the engine core in a child process.

Stats come from vLLM itself: a StatLoggerBase passed as `stat_loggers` receives each step's
SchedulerStats (running / waiting, KV usage, prefix cache queries / hits) and IterationStats
(prompt / generation tokens, preemptions), the same numbers vLLM's own Prometheus logger
exports (vllm_stats.py). vLLM is imported lazily so that importing this module costs nothing where only the
sim or openai-http engine runs.

A chat is rendered the way vLLM's own chat entry points render it (`LLM.chat`, the OpenAI
server): the model's chat template with the generation prompt, through vLLM's renderer;
a plain `prompt` is tokenized raw (vllm_inputs.py). A prompt with a `suffix` (fill-in-the-middle) is
rendered in the model's FIM format (core/fim.py): the worker's `fim_format`, else vLLM's own renderer's
where it has one (DeepSeek V4); with neither the engine does not offer `suffix` and refuses it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from llmbus_services.engine_worker.adapters.engines import vllm_inputs, vllm_tools
from llmbus_services.engine_worker.adapters.engines.structured import named_tool, structured_outputs
from llmbus_services.engine_worker.adapters.engines.vllm_stats import StatsSink, stat_logger_factory
from llmbus_services.engine_worker.core import fim
from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineError,
    EngineOOM,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRejected,
)

log = logging.getLogger(__name__)

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "no available memory for the cache")


@dataclass
class VllmConfig:
    model: str  # the name the fleet knows it by (ModelSpec.name)
    model_path: str = ""  # a local directory or a hub name already in the local cache; default: `model`
    dtype: str = "auto"  # "float32" for the CPU tiny model, "bfloat16" / "float16" on GPU
    quantization: str | None = None  # "fp8" | "awq" | "gptq" (see node/formats.py)
    max_model_len: int = 2048
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    # True: no CUDA graphs / compile (faster cold start, what the CPU build needs). None: eager on
    # the CPU build, CUDA graphs captured on GPU (decode steps without per-kernel launch cost).
    enforce_eager: bool | None = None
    gpu_memory_utilization: float = 0.80  # the memory pool: weights + activations + KV cache
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    kv_offloading_gib: float | None = None  # host-memory KV tier (vLLM's kv_offloading_size); None: none
    kv_cache_memory_bytes: int | None = None
    cpu_kvcache_space_gib: float | None = None  # sets VLLM_CPU_KVCACHE_SPACE (CPU build only); None: env as is
    enable_prefix_caching: bool = True
    block_size: int | None = None  # None: the platform's default (16 on GPU, 128 on CPU)
    scheduling_policy: str = "fcfs"  # "priority" makes EngineRequest.priority count (0 = first)
    seed: int = 0
    ignore_eos: bool = False  # benchmarks want fixed-length outputs, like `vllm bench --ignore-eos`
    otlp_traces_endpoint: str | None = None  # without it vLLM drops the trace headers
    # vLLM's --tool-call-parser (e.g. "hermes" for Qwen2.5): tool_choice "auto" parses calls out of the
    # model's text, "required" makes it write one in its own format. None: "auto" answers text.
    tool_call_parser: str | None = None
    # The model's fill-in-the-middle format: a name of core/fim.py's FIM_FORMATS ("qwen2.5-coder", ...)
    # or a template with {prefix} and {suffix}. None: vLLM's renderer's, if the model's has one.
    fim_format: str | None = None
    warmup_iterations: int = 5  # before ready: this many dummy prompts, one after the other ...
    warmup_prompt_tokens: int = 1024  # ... of this many tokens (capped to max_model_len)
    # How the engine-core process starts. None: vLLM's choice (the CPU build forces "spawn", which
    # imports torch and vLLM again in the child: ~20 CPU-seconds per start). "fork" reuses this
    # process's imports; the test suite uses it with one OpenMP thread (libgomp is not fork-safe
    # once it has a thread pool).
    engine_core_start_method: Literal["fork", "spawn"] | None = None
    extra_engine_args: dict[str, Any] = field(default_factory=dict)


def classify_error(exc: BaseException) -> EngineError:
    """Turn a vLLM / torch failure into the error the worker reports.

    Only OOM and a dead engine core restart the engine; validation errors are final for the
    request; anything else is retried elsewhere while the engine keeps serving the others.
    """
    if isinstance(exc, EngineError):
        return exc
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    if any(type(e).__name__ == "OutOfMemoryError" for e in chain) or any(m in text.lower() for m in _OOM_MARKERS):
        return EngineOOM(f"engine out of memory: {text}")
    if any(type(e).__name__ == "EngineDeadError" for e in chain):
        return EngineDead(f"vLLM engine core is dead: {text}")
    if any(type(e).__name__ in ("VLLMValidationError", "VLLMClientError") for e in chain):
        return RequestRejected(f"vLLM refused the request: {text}")  # the same request fails everywhere
    return EngineError(f"vLLM generate failed: {text}")  # retried elsewhere; the engine lives on


class VllmEngine:
    name = "vllm"

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.model = config.model
        self.max_model_len = config.max_model_len
        self.max_num_seqs = config.max_num_seqs
        self.cold_start_s: float | None = None
        self.cold_start_phases_s: dict[str, float] = {}  # "import", "config", "engine_core", "warmup"
        self._llm: Any = None
        self._tokenizer: Any = None
        self._last_encoding: tuple[str, list[int]] | None = None
        self._sink = StatsSink()
        self._block_size = 16
        self._blocks_total = 0
        self._active: set[str] = set()
        self._abort_requested: set[str] = set()
        self._dead: EngineError | None = None
        self._fim: fim.FimTemplate | None = None
        self._renderer_fim = False  # vLLM's renderer has the model's FIM format (DeepSeek V4)

    @property
    def features(self) -> frozenset[str]:
        """What this engine honours beyond text: `suffix` only where a FIM format is known."""
        base = frozenset({"response_format", "tools"})
        return base | {"suffix"} if self._fim is not None or self._renderer_fim else base

    # ---- lifecycle -------------------------------------------------------------------------

    def enforce_eager(self) -> bool:
        if self.config.enforce_eager is not None:
            return self.config.enforce_eager
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())

    def _engine_args(self) -> Any:
        from vllm.engine.arg_utils import AsyncEngineArgs

        cfg = self.config
        kwargs: dict[str, Any] = {
            "model": cfg.model_path or cfg.model,
            "served_model_name": cfg.model,
            "dtype": cfg.dtype,
            "quantization": cfg.quantization,
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "enforce_eager": self.enforce_eager(),
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "pipeline_parallel_size": cfg.pipeline_parallel_size,
            "kv_offloading_size": cfg.kv_offloading_gib,
            "kv_cache_memory_bytes": cfg.kv_cache_memory_bytes,
            "enable_prefix_caching": cfg.enable_prefix_caching,
            "scheduling_policy": cfg.scheduling_policy,
            "seed": cfg.seed,
            "otlp_traces_endpoint": cfg.otlp_traces_endpoint,
            # Our stat logger replaces vLLM's default logging / Prometheus loggers: the worker
            # exports the metrics itself, and a restart would re-register vLLM's collectors.
            "disable_log_stats": True,
        }
        if cfg.block_size is not None:
            kwargs["block_size"] = cfg.block_size
        if cfg.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = cfg.max_num_batched_tokens
        kwargs.update(cfg.extra_engine_args)
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        if self._llm is not None:
            return
        started = time.monotonic()
        if self.config.tool_call_parser is not None:
            try:
                vllm_tools.check_parser(self.config.tool_call_parser)  # a wrong name fails here, not per request
            except KeyError as exc:
                raise EngineDead(f"unknown vLLM tool-call parser: {exc}") from exc
        try:
            template = None if self.config.fim_format is None else fim.parse_fim_template(self.config.fim_format)
        except ValueError as exc:
            raise EngineDead(str(exc)) from exc
        if self.config.kv_cache_memory_bytes is not None:
            # The CPU build's legacy variable would override an explicit size (vllm/platforms/cpu.py).
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        elif self.config.cpu_kvcache_space_gib is not None:
            # Read when the engine config is made (CPU build only; ignored on GPU).
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = f"{self.config.cpu_kvcache_space_gib:g}"
        from vllm.v1.engine.async_llm import AsyncLLM  # the first import takes seconds (torch and all)

        imported = time.monotonic()
        self._sink = StatsSink()
        self._dead = None
        # Building the engine blocks for the whole load (tens of seconds): do it off the event
        # loop so the worker keeps heartbeating "starting" meanwhile.
        try:
            # Two phases seen from here: the config (model files read, platform resolved), then the
            # engine core (weights loaded, KV cache profiled and allocated, CUDA graphs captured).
            vllm_config = await asyncio.to_thread(self._engine_args().create_engine_config)
            if self.config.engine_core_start_method is not None:
                # After the config: the CPU platform sets "spawn" while it checks the config.
                os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = self.config.engine_core_start_method
            configured = time.monotonic()
            self._llm = await asyncio.to_thread(
                AsyncLLM.from_vllm_config, vllm_config, stat_loggers=[stat_logger_factory(self._sink)]
            )
        except Exception as exc:
            # The engine core fails in its own process (weights, KV cache that does not fit):
            # vLLM logs the root cause there and raises a generic error here.
            err = classify_error(exc)
            raise (err if isinstance(err, EngineOOM) else EngineDead(f"vLLM engine failed to start: {exc!r}")) from exc
        self._tokenizer = self._llm.get_tokenizer()
        if template is not None and (unknown := fim.unknown_sentinels(template, self._tokenizer.get_vocab())):
            await self.stop()  # the model would see the sentinels as plain text, not as FIM
            raise EngineDead(f"FIM format {self.config.fim_format!r}: {unknown} are not tokens of {self.model!r}")
        self._fim = template
        self._renderer_fim = self._llm.renderer.render_completion_suffix("", "") is not None
        cache = self._llm.vllm_config.cache_config
        self._block_size = int(cache.block_size)
        self._blocks_total = int(cache.num_gpu_blocks or 0)
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.cold_start_s = time.monotonic() - started
        self.cold_start_phases_s = {
            "import": round(imported - started, 3),
            "config": round(configured - imported, 3),
            "engine_core": round(time.monotonic() - configured, 3),
        }
        log.info(
            "vLLM engine %s up in %.1f s: %d KV blocks of %d",
            self.model,
            self.cold_start_s,
            self._blocks_total,
            self._block_size,
        )

    async def warmup(self) -> None:
        """The warm-up plan: `warmup_iterations` prefills of `warmup_prompt_tokens` dummy tokens.

        Each iteration's tokens differ from the others', so none is served from the prefix cache.
        """
        llm = self._require_llm()
        started = time.monotonic()
        plan = vllm_inputs.warmup_plan(
            self._tokenizer, self.config.warmup_iterations, self.config.warmup_prompt_tokens, self.max_model_len
        )
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=vllm_inputs.WARMUP_OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
        for i, prompt_ids in enumerate(plan):
            (engine_input,) = await llm.renderer.render_cmpl_async([{"prompt_token_ids": prompt_ids}])
            async for _ in llm.generate(engine_input, params, f"llmbus-warmup-{i}"):
                pass
        self.cold_start_phases_s["warmup"] = round(time.monotonic() - started, 3)

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        self._active.clear()
        if llm is not None:
            # Stop reading outputs first: otherwise the reader sees the core go away and logs
            # a spurious "output_handler failed" traceback.
            if llm.output_handler is not None:
                llm.output_handler.cancel()
            await asyncio.to_thread(llm.shutdown)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def dead(self) -> bool:
        return self._dead is not None or (self._llm is not None and bool(self._llm.errored))

    # ---- requests --------------------------------------------------------------------------

    def _require_llm(self) -> Any:
        if self._llm is None:
            raise EngineDead("vLLM engine is not running")
        if self.dead:
            raise self._dead or EngineDead("vLLM engine core is dead")
        return self._llm

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            raise EngineDead("vLLM engine is not running")
        # The worker counts a prompt's tokens for admission and then generates from the very same
        # string: the second encode is served from here (identity check, so no hashing of the text).
        last = self._last_encoding
        if last is not None and last[0] is text:
            return last[1]
        ids = list(self._tokenizer.encode(text))
        self._last_encoding = (text, ids)
        return ids

    def count_tokens(self, text: str) -> int:
        return len(self._encode(text))

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._block_size)

    def _blocks_free(self) -> int:
        return round(self._blocks_total * (1.0 - self._sink.kv_cache_usage))

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise AdmissionError(
                f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}"
            )
        needed, free = self._blocks(prompt_tokens + max_tokens), self._blocks_free()
        if self._blocks_total and needed > free:
            raise AdmissionError(f"needs {needed} KV blocks, {free} free of {self._blocks_total}")

    def _sampling_params(
        self, request: EngineRequest, forced_tool: dict[str, Any] | None, calls: vllm_tools.ToolCallStream | None
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        constraint = calls.structured_outputs if calls is not None else None
        return SamplingParams(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            ignore_eos=self.config.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=constraint or structured_outputs(request.response_format, forced_tool),
            skip_special_tokens=calls.skip_special_tokens if calls is not None else True,
        )

    async def _admitted_input(self, llm: Any, request: EngineRequest) -> Any:
        """The request's engine input (token ids), once its length is admitted."""
        if not request.messages:
            # Tokenized once here (admission needs the count) and handed over as token ids.
            text = request.prompt if request.suffix is None else self._fim_text(llm, request.prompt, request.suffix)
            prompt_ids = self._encode(text)
            self.check_admission(len(prompt_ids), request.max_tokens)
            (engine_input,) = llm.renderer.render_cmpl([{"prompt_token_ids": prompt_ids}])
            return engine_input
        try:
            engine_input = await vllm_inputs.render_chat(llm.renderer, request.messages, request.tools)
        except Exception as exc:
            err = classify_error(exc)
            if type(err) is EngineError:  # the template refused this chat: it would everywhere
                err = RequestRejected(f"the model's chat template rejects the messages: {exc!r}")
            raise err from exc
        self.check_admission(len(engine_input["prompt_token_ids"]), request.max_tokens)
        return engine_input

    def _fim_text(self, llm: Any, prefix: str, suffix: str) -> str:
        """The prompt in the model's FIM format; never the prefix alone (a silent plain completion)."""
        if self._fim is not None:
            return self._fim.render(prefix, suffix)
        rendered = llm.renderer.render_completion_suffix(prefix, suffix)
        if rendered is None:
            raise RequestRejected(f"suffix: no fill-in-the-middle format is configured for {self.model!r}")
        return str(rendered)

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        llm = self._require_llm()
        try:
            forced_tool = named_tool(request.tools, request.tool_choice)
        except ValueError as exc:
            raise RequestRejected(str(exc)) from exc
        calls = None if forced_tool else self._tool_call_stream(request)
        engine_input = await self._admitted_input(llm, request)
        prompt_ids = engine_input["prompt_token_ids"]
        completion_tokens = 0
        called = False
        self._active.add(request.request_id)
        try:
            async for out in llm.generate(
                engine_input,
                self._sampling_params(request, forced_tool, calls),
                request.request_id,
                trace_headers=request.trace_headers or None,
                priority=request.priority if self.config.scheduling_policy == "priority" else 0,
            ):
                if request.request_id in self._abort_requested and not out.finished:
                    # abort() came before vLLM had registered the request: repeat it now.
                    self._abort_requested.discard(request.request_id)
                    await llm.abort(request.request_id)
                comp = out.outputs[0]
                new_tokens = len(comp.token_ids)
                first = completion_tokens == 0
                completion_tokens += new_tokens
                if calls is not None:
                    delta, tool_calls = calls.feed(comp.text, comp.token_ids, prompt_ids, out.finished)
                else:
                    delta = "" if forced_tool else comp.text
                    tool_calls = vllm_tools.forced_call_delta(request.request_id, forced_tool, comp.text, first)
                called = called or (calls is not None and bool(tool_calls))
                yield EngineOutput(
                    delta=delta,
                    tool_calls=tool_calls,
                    new_tokens=new_tokens,
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=completion_tokens,
                    cached_prompt_tokens=out.num_cached_tokens or 0,
                    finished=out.finished,
                    finish_reason=vllm_tools.finish_reason(comp.finish_reason, called) if out.finished else None,
                    # vLLM counts this request's PREEMPTED events (RequestStateStats, with stats on).
                    preemptions=getattr(out.metrics, "num_preemptions", 0),
                )
        except (asyncio.CancelledError, GeneratorExit):
            raise  # vLLM aborts the request itself when its generator is closed
        except Exception as exc:
            err = classify_error(exc)
            if llm.errored and not err.restarts_engine:  # whatever the request saw, the core is gone
                err = EngineDead(f"vLLM engine core is dead: {err}", err.code if isinstance(err, EngineOOM) else None)
            if isinstance(err, EngineDead):
                self._dead = err
            raise err from exc
        finally:
            self._active.discard(request.request_id)
            self._abort_requested.discard(request.request_id)

    def _tool_call_stream(self, request: EngineRequest) -> vllm_tools.ToolCallStream | None:
        try:
            return vllm_tools.tool_call_stream(
                self.config.tool_call_parser, self._tokenizer, self.model, request.tools, request.tool_choice
            )
        except ValidationError as exc:  # vLLM's request model refused the tools (a malformed definition)
            raise RequestRejected(f"vLLM refused the tools: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        # vLLM ends the request's stream with a final output whose finish_reason is "abort".
        if self._llm is not None and request_id in self._active and not self.dead:
            self._abort_requested.add(request_id)
            await self._llm.abort(request_id)

    def stats(self) -> EngineStats:
        s = self._sink
        # vLLM's gauges come with engine steps; an idle engine takes no steps, so the last
        # step's "1 running" would otherwise stick after the last request finished.
        idle = not self._active
        return EngineStats(
            num_requests_running=0 if idle else s.num_running,
            num_requests_waiting=0 if idle else s.num_waiting,
            kv_block_size=self._block_size,
            kv_blocks_total=self._blocks_total,
            kv_blocks_free=self._blocks_free(),
            kv_cache_usage_perc=s.kv_cache_usage,
            prefix_cache_queries_total=s.prefix_queries,
            prefix_cache_hits_total=s.prefix_hits,
            external_prefix_cache_hits_total=s.external_prefix_hits,
            prompt_tokens_total=s.prompt_tokens,
            generation_tokens_total=s.generation_tokens,
            num_preemptions_total=s.preemptions,
        )
