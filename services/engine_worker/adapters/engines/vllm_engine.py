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

Before it starts, the installed vLLM must be the tested release (vllm_version.py). The engine core's start is
timed inside vLLM's own worker (vllm_phases.py): weights, KV pool, kernels.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError

from llmbus.contract.engine_features import ENGINE_FEATURES
from llmbus_services.engine_worker.adapters.engines import vllm_inputs, vllm_phases, vllm_sampling, vllm_tools
from llmbus_services.engine_worker.adapters.engines.structured import named_tool, structured_outputs
from llmbus_services.engine_worker.adapters.engines.vllm_choices import Choices as _Choices
from llmbus_services.engine_worker.adapters.engines.vllm_engine_config import VllmConfig
from llmbus_services.engine_worker.adapters.engines.vllm_errors import classify_error
from llmbus_services.engine_worker.adapters.engines.vllm_lora import VllmAdapters, adapter_slots, lora_engine_args
from llmbus_services.engine_worker.adapters.engines.vllm_stats import StatsSink, stat_logger_factory
from llmbus_services.engine_worker.adapters.engines.vllm_version import check_vllm_version, installed_vllm
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


class VllmEngine:
    name = "vllm"

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self.model = config.model
        # What vLLM resolved once the engine is up (the settings, or vLLM's defaults); 0 until then if unset.
        self.max_model_len = config.max_model_len or 0
        self.max_num_seqs = config.max_num_seqs or 0
        self.cold_start_s: float | None = None
        # "import", "config", then the engine core's start split (vllm_phases.py), then "warmup"
        self.cold_start_phases_s: dict[str, float] = {}
        self._llm: Any = None
        self._tokenizer: Any = None
        self._last_encoding: tuple[str, list[int]] | None = None
        self._sink = StatsSink()
        self._block_size = 16
        self._blocks_total = 0
        self._active: set[str] = set()
        # Requests handed to vLLM whose first output has not come: request id → prompt tokens. vLLM's
        # stats have no gauge of the prefill still to do; a request's first output ends its prefill.
        self._prefilling: dict[str, int] = {}
        self._abort_requested: set[str] = set()
        self._dead: EngineError | None = None
        self._fim: fim.FimTemplate | None = None
        self._renderer_fim = False  # vLLM's renderer has the model's FIM format (DeepSeek V4)
        self.lora = adapter_slots(config)  # LoRA adapter slots (vllm_lora.py); None: no adapters
        self._adapters = VllmAdapters(self.lora) if self.lora is not None else None
        self._model_defaults: dict[str, Any] = {}  # the model's generation config (vllm serve's defaults)
        self._developer_role = False  # the chat template knows the `developer` role (else: as system)

    @property
    def features(self) -> frozenset[str]:
        """What this engine honours beyond text: `suffix` only where a FIM format is known."""
        base = ENGINE_FEATURES["vllm"]
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
        # Left out when unset: vLLM then applies its own defaults (the model's window, the platform's batch).
        optional = {
            "max_model_len": cfg.max_model_len,
            "max_num_seqs": cfg.max_num_seqs,
            "block_size": cfg.block_size,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
        }
        kwargs.update({name: value for name, value in optional.items() if value is not None})
        kwargs.update(lora_engine_args(cfg))
        kwargs.update(cfg.extra_engine_args)
        return AsyncEngineArgs(**kwargs)

    async def start(self) -> None:
        if self._llm is not None:
            return
        started = time.monotonic()
        check_vllm_version(installed_vllm(), self.config.allow_untested_version)  # before the long import
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
        if self.lora is not None:
            self.lora.keep_only(set())  # a new engine core holds no adapter yet
        # Building the engine blocks for the whole load (tens of seconds): do it off the event
        # loop so the worker keeps heartbeating "starting" meanwhile.
        try:
            # Seen from here: the config (model files read, platform resolved), then the engine core's start,
            # which vLLM's workers time inside (vllm_phases.py: weights, KV pool, kernels).
            vllm_config = await asyncio.to_thread(self._engine_args().create_engine_config)
            timed_worker = vllm_phases.timed_worker_cls(vllm_config.parallel_config.worker_cls)
            if timed_worker is not None:
                vllm_config.parallel_config.worker_cls = timed_worker
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
        engine_core_s = time.monotonic() - configured
        self._renderer_fim = self._llm.renderer.render_completion_suffix("", "") is not None
        cache = self._llm.vllm_config.cache_config
        self._block_size = int(cache.block_size)
        self._blocks_total = int(cache.num_gpu_blocks or 0)
        self.max_model_len = int(self._llm.model_config.max_model_len)
        self.max_num_seqs = int(self._llm.vllm_config.scheduler_config.max_num_seqs)
        self._model_defaults = self._llm.model_config.get_diff_sampling_param()
        chat_template = getattr(self._tokenizer, "chat_template", None)
        self._developer_role = isinstance(chat_template, str) and "developer" in chat_template
        self.cold_start_s = time.monotonic() - started
        self.cold_start_phases_s = {
            "import": round(imported - started, 3),
            "config": round(configured - imported, 3),
            **vllm_phases.engine_core_phases(engine_core_s, await self._worker_phases(timed_worker is not None)),
        }
        log.info(
            "vLLM engine %s up in %.1f s: %d KV blocks of %d",
            self.model,
            self.cold_start_s,
            self._blocks_total,
            self._block_size,
        )

    async def _worker_phases(self, timed: bool) -> list[dict[str, float]]:
        """Each rank's start phases, as vLLM's timed worker recorded them (none: the start stays one phase)."""
        if not timed:
            return []
        try:
            return list(await asyncio.wait_for(self._llm.collective_rpc(vllm_phases.RPC_METHOD), 30))
        except Exception:  # the split is a report: the engine is up and serves without it
            log.warning("vLLM's workers did not report their start phases", exc_info=True)
            return []

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
        self._prefilling.clear()
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

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        return len(self._encode(text))  # the model's own tokenizer, whatever the catalog names

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._block_size)

    def _blocks_free(self) -> int:
        return round(self._blocks_total * (1.0 - self._sink.kv_cache_usage))

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise AdmissionError(
                f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}",
                prompt_tokens,
            )
        needed, free = self._blocks(prompt_tokens + max_tokens), self._blocks_free()
        if self._blocks_total and needed > free:
            raise AdmissionError(f"needs {needed} KV blocks, {free} free of {self._blocks_total}", prompt_tokens)

    def _sampling_params(
        self,
        request: EngineRequest,
        max_tokens: int,
        forced_tool: dict[str, Any] | None,
        calls: vllm_tools.ToolCallStream | None,
    ) -> Any:
        from vllm.sampling_params import RequestOutputKind

        constraint = calls.structured_outputs if calls is not None else None
        try:
            return vllm_sampling.sampling_params(
                request,
                max_tokens,
                self._model_defaults,
                ignore_eos=self.config.ignore_eos,
                output_kind=RequestOutputKind.DELTA,
                structured_outputs=constraint or structured_outputs(request.response_format, forced_tool),
                skip_special_tokens=calls.skip_special_tokens if calls is not None else True,
            )
        except Exception as exc:  # vLLM's own validation (a value out of its range): final, with its param
            raise classify_error(exc) from exc

    async def _admitted_input(self, llm: Any, request: EngineRequest) -> tuple[Any, int]:
        """The request's engine input (token ids) and its max_tokens, once its length is admitted. The
        count is of what the model reads (a chat with its template and tools): over the window it goes back
        with the refusal, so the scheduler ends the request prompt_too_long where no worker can take it.
        The next leg of a cut answer reads the answer so far after the prompt (`_continued`)."""
        engine_input: Any = None
        if not request.messages:
            if request.reasoning_effort is not None:
                raise RequestRejected("reasoning_effort needs a chat (the chat template reads it)", "reasoning_effort")
            # Tokenized once here (admission needs the count) and handed over as token ids.
            text = request.prompt if request.suffix is None else self._fim_text(llm, request.prompt, request.suffix)
            prompt_ids = self._encode(text)
        else:
            try:
                engine_input = await vllm_inputs.render_chat(
                    llm.renderer,
                    request.messages,
                    request.tools,
                    reasoning_effort=request.reasoning_effort,
                    developer_role=self._developer_role,
                )
            except Exception as exc:
                err = classify_error(exc)
                if type(err) is EngineError:  # the template refused this chat: it would everywhere
                    err = RequestRejected(f"the model's chat template rejects the messages: {exc!r}")
                raise err from exc
            prompt_ids = list(engine_input["prompt_token_ids"])
        if request.continuation is not None:
            prompt_ids, engine_input = self._continued(prompt_ids, request.continuation.text), None
        max_tokens = vllm_sampling.max_tokens_for(request, len(prompt_ids), self.max_model_len, self._model_defaults)
        self.check_admission(len(prompt_ids), max_tokens)
        if engine_input is None:
            (engine_input,) = llm.renderer.render_cmpl([{"prompt_token_ids": prompt_ids}])
        return engine_input, max_tokens

    def can_continue(self, request: EngineRequest) -> bool:
        return True  # the answer so far is read as prompt token ids (`_continued`)

    def _continued(self, prompt_ids: list[int], answer_so_far: str) -> list[int]:
        """The prompt's token ids (a chat: its template's, generation prompt included) followed by the answer
        so far, tokenized without special tokens: the model goes on from the last token the client was sent.
        vLLM's detokenizer starts from these ids, so the first new word keeps the space it needs."""
        return [*prompt_ids, *self._tokenizer.encode(answer_so_far, add_special_tokens=False)]

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
            raise RequestRejected(str(exc), "tool_choice") from exc
        calls = {0: self._tool_call_stream(request)} if not forced_tool else {}
        engine_input, max_tokens = await self._admitted_input(llm, request)
        if request.cache_salt:  # vLLM mixes it into the first block's hash: a tenant hits only its own prefixes
            engine_input["cache_salt"] = request.cache_salt
        params = self._sampling_params(request, max_tokens, forced_tool, calls.get(0))
        lora_request = await self._lora_request(request)
        reconcile_adapters = lora_request is not None  # after its first output, what vLLM holds is known
        prompt_ids = engine_input["prompt_token_ids"]
        choices = _Choices(request, forced_tool)
        self._active.add(request.request_id)
        self._prefilling[request.request_id] = len(prompt_ids)
        try:
            async for out in llm.generate(
                engine_input,
                params,
                request.request_id,
                trace_headers=request.trace_headers or None,
                priority=request.priority if self.config.scheduling_policy == "priority" else 0,
                lora_request=lora_request,
            ):
                if request.request_id in self._abort_requested and not out.finished:
                    # abort() came before vLLM had registered the request: repeat it now.
                    self._abort_requested.discard(request.request_id)
                    await llm.abort(request.request_id)
                if reconcile_adapters and self._adapters is not None:
                    reconcile_adapters = False  # loaded by now: what vLLM holds goes in the heartbeat
                    await self._adapters.reconcile(llm)
                self._prefilling.pop(request.request_id, None)  # an output came: its prompt is prefilled
                # One output per choice that moved (n > 1 gives several); the request's counts after each.
                if out.finished and not out.outputs:  # every choice's end was sent with its last tokens
                    yield choices.closing(prompt_ids, out)
                for position, comp in enumerate(out.outputs):
                    if comp.index not in calls and not forced_tool:
                        calls[comp.index] = self._tool_call_stream(request)
                    stream = calls.get(comp.index)
                    last = out.finished and position == len(out.outputs) - 1
                    yield choices.output(comp, stream, prompt_ids, out, last, self._decode)
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
            self._prefilling.pop(request.request_id, None)
            self._abort_requested.discard(request.request_id)

    async def _lora_request(self, request: EngineRequest) -> Any:
        if request.adapter is None:
            return None
        if self._adapters is None:
            raise RequestRejected(f"{self.model!r} is served without LoRA adapters ({request.adapter.name!r} asked)")
        return await self._adapters.request_for(request.adapter)

    def _decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids))

    def _tool_call_stream(self, request: EngineRequest) -> vllm_tools.ToolCallStream | None:
        try:
            return vllm_tools.tool_call_stream(
                self.config.tool_call_parser, self._tokenizer, self.model, request.tools, request.tool_choice
            )
        except ValidationError as exc:  # vLLM's request model refused the tools (a malformed definition)
            raise RequestRejected(f"vLLM refused the tools: {exc}", "tools") from exc

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
            prefill_backlog_tokens=sum(self._prefilling.values()),
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
