"""The `onnx` engine: ONNX Runtime on a CPU node, through onnxruntime-genai's generator (its KV cache and sampling).

The model is an onnxruntime-genai model directory (genai_config.json, model.onnx, the tokenizer files), as its
model builder writes it from a Hugging Face checkpoint (`python -m onnxruntime_genai.models.builder -i <hf dir>
-o <dir> -p fp32 -e cpu`; llmbus_tools/harness/tiny_onnx.py). Each request has its own generator; a step (one
token) runs in a thread of the engine's pool, so the event loop keeps streaming and heartbeating, and up to
`max_num_seqs` requests step side by side (ONNX Runtime's session is safe to run from several threads).

A chat is rendered by the model's chat template (the tokenizer's, as Hugging Face renders it); a prompt is
tokenized as it is. Stop strings end the answer before them, as vLLM does; EOS ends it unless `ignore_eos`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmbus_services.engine_worker.core.engine import (
    AdmissionError,
    EngineDead,
    EngineOutput,
    EngineRequest,
    EngineStats,
    RequestRejected,
    answer_room,
)
from llmbus_services.engine_worker.core.stops import HeldText

log = logging.getLogger(__name__)
KV_BLOCK_TOKENS = 16  # the unit its KV capacity is reported in (the scheduler's fit and KV-use plugins read it)


@dataclass
class OnnxConfig:
    model: str  # the name the fleet knows it by (ModelSpec.name)
    model_path: str  # an onnxruntime-genai model directory (genai_config.json beside model.onnx)
    max_model_len: int | None = None  # None: the model's context_length (genai_config.json)
    max_num_seqs: int = 4  # requests generating at once (one thread each)
    ignore_eos: bool = False  # benchmarks and tests: fixed output lengths
    warmup_tokens: int = 4


class OnnxEngine:
    name = "onnx"
    model_format = "onnx"  # what the capability filter prices it as (services/scheduler/policies/tables)

    def __init__(self, config: OnnxConfig) -> None:
        self.config = config
        self.model = config.model
        self.max_model_len = config.max_model_len or 0
        self.max_num_seqs = config.max_num_seqs
        self._og: Any = None
        self._model: Any = None
        self._tokenizer: Any = None
        self._vocab_size = 0
        self._pool: ThreadPoolExecutor | None = None
        self._running: dict[str, int] = {}  # request → the KV tokens its generator holds (prompt + max_tokens)
        self._aborted: set[str] = set()
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self._model is not None:
            return
        import onnxruntime_genai as og  # imported here: only an onnx worker pays for it

        path = Path(self.config.model_path)
        if not (path / "genai_config.json").is_file():
            raise EngineDead(f"{path} is not an onnxruntime-genai model directory (no genai_config.json)")
        genai_config = json.loads((path / "genai_config.json").read_text())["model"]
        started = time.monotonic()
        try:
            self._model = await asyncio.to_thread(og.Model, str(path))
        except Exception as exc:
            raise EngineDead(f"onnxruntime-genai could not load {path}: {exc!r}") from exc
        self._og = og
        self._tokenizer = og.Tokenizer(self._model)
        self._vocab_size = int(genai_config["vocab_size"])
        context = int(genai_config["context_length"])
        self.max_model_len = min(self.config.max_model_len or context, context)
        self._pool = ThreadPoolExecutor(self.max_num_seqs, thread_name_prefix="onnx-step")
        log.info(
            "ONNX model %s loaded in %.2f s (window %d)", self.model, time.monotonic() - started, self.max_model_len
        )

    async def warmup(self) -> None:
        request = EngineRequest("llmbus-warmup", "warm up the engine", max_tokens=self.config.warmup_tokens)
        async for _ in self.generate(request):
            pass

    async def stop(self) -> None:
        self._aborted |= set(self._running)
        pool, self._pool = self._pool, None
        if pool is not None:
            await asyncio.to_thread(pool.shutdown, True)
        self._model = self._tokenizer = None

    # ---- requests --------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        if self._tokenizer is None:
            raise EngineDead("the ONNX engine is not running")
        return [int(i) for i in self._tokenizer.encode(text)]

    def count_tokens(self, text: str, tokenizer: str | None = None) -> int:
        return len(self._encode(text))  # the model's own tokenizer, whatever the catalog names

    def check_admission(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens + max_tokens > self.max_model_len:
            raise AdmissionError(
                f"prompt {prompt_tokens} + max_tokens {max_tokens} > max_model_len {self.max_model_len}"
            )
        if len(self._running) >= self.max_num_seqs:
            raise AdmissionError(f"{len(self._running)} requests generating, max_num_seqs {self.max_num_seqs}")

    def _prompt_ids(self, request: EngineRequest) -> list[int]:
        if request.suffix is not None:
            raise RequestRejected("suffix: the onnx engine has no fill-in-the-middle format")
        if not request.messages:
            return self._encode(request.prompt)
        conversation = [m.model_dump(mode="json", exclude_none=True) for m in request.messages]
        try:
            text = self._tokenizer.apply_chat_template(json.dumps(conversation), add_generation_prompt=True)
        except Exception as exc:  # the template refused this chat: it would everywhere
            raise RequestRejected(f"the model's chat template rejects the messages: {exc!r}") from exc
        return self._encode(text)

    def _generator(self, request: EngineRequest, prompt_ids: list[int], max_tokens: int) -> Any:
        """A generator with the request's sampling; what it leaves unset is the model's (genai_config.json)."""
        og = self._og
        params = og.GeneratorParams(self._model)
        total = len(prompt_ids) + max_tokens
        options: dict[str, Any] = {"max_length": total, "min_length": total if self.config.ignore_eos else 0}
        if request.temperature is not None:
            options["do_sample"] = request.temperature > 0
            if request.temperature > 0:
                options["temperature"] = request.temperature
                options["top_k"] = request.top_k or self._vocab_size  # OpenAI's sampling has no top-k
        if request.top_p is not None:
            options["top_p"] = request.top_p
        if request.top_k is not None:
            options["top_k"] = request.top_k
        if request.repetition_penalty is not None:
            options["repetition_penalty"] = request.repetition_penalty
        if request.seed is not None:
            options["random_seed"] = request.seed
        params.set_search_options(**options)
        generator = og.Generator(self._model, params)
        generator.append_tokens(prompt_ids)
        return generator

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        if self._model is None or self._pool is None:
            raise EngineDead("the ONNX engine is not running")
        prompt_ids = self._prompt_ids(request)
        # An unset max_tokens takes what the window leaves of the output cap; EOS ends the answer before.
        max_tokens = answer_room(len(prompt_ids), request.max_tokens, request.max_tokens_auto, self.max_model_len)
        self.check_admission(len(prompt_ids), max_tokens)
        loop = asyncio.get_running_loop()
        rid = request.request_id
        self._running[rid] = len(prompt_ids) + max_tokens
        try:
            generator = await loop.run_in_executor(self._pool, self._generator, request, prompt_ids, max_tokens)
            self._prompt_tokens_total += len(prompt_ids)
            stream = self._tokenizer.create_stream()
            eos = {int(i) for i in self._tokenizer.eos_token_ids}
            answer, completion = HeldText(request.stop), 0
            while True:
                if rid in self._aborted:
                    yield EngineOutput(answer.release(True), 0, len(prompt_ids), completion, 0, True, "abort")
                    return
                token = await loop.run_in_executor(self._pool, _next_token, generator)
                completion += 1
                self._generation_tokens_total += 1
                at_eos = token in eos and not self.config.ignore_eos
                finish = "stop" if answer.add("" if at_eos else stream.decode(token)) or at_eos else None
                if finish is None and (completion >= max_tokens or generator.is_done()):
                    finish = "length" if completion >= max_tokens else "stop"
                done = finish is not None
                yield EngineOutput(answer.release(done), 1, len(prompt_ids), completion, 0, done, finish)
                if done:
                    return
        finally:
            self._running.pop(rid, None)
            self._aborted.discard(rid)

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._aborted.add(request_id)  # its loop ends with "abort" before its next step

    def stats(self) -> EngineStats:
        # No paged pool: each generator holds a KV cache of its whole length (prompt + max_tokens) from its
        # start, and the engine holds max_num_seqs of them at most. Counted in blocks of KV_BLOCK_TOKENS.
        total = -(-self.max_num_seqs * self.max_model_len // KV_BLOCK_TOKENS)
        used = sum(-(-tokens // KV_BLOCK_TOKENS) for tokens in self._running.values())
        return EngineStats(
            num_requests_running=len(self._running),
            kv_block_size=KV_BLOCK_TOKENS,
            kv_blocks_total=total,
            kv_blocks_free=max(0, total - used),
            kv_cache_usage_perc=min(1.0, used / total) if total else 0.0,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
        )


def _next_token(generator: Any) -> int:
    generator.generate_next_token()
    return int(generator.get_next_tokens()[0])
