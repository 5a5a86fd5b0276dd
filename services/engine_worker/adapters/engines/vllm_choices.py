"""vLLM's outputs of one request as EngineOutputs: each choice's text or tool calls, its log-probabilities,
its finish reason when it ends, and the request's counts over every choice (n > 1 streams several).

vLLM's OpenAI server is the model: a choice's tool calls go through its own parser, `parallel_tool_calls:
false` keeps the first call (vLLM's maybe_filter_parallel_tool_calls), and an answer that made calls
ends "tool_calls".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llmbus.contract.messages import ToolCallDelta
from llmbus_services.engine_worker.adapters.engines import vllm_sampling, vllm_tools
from llmbus_services.engine_worker.core.engine import EngineOutput, EngineRequest


class Choices:
    def __init__(self, request: EngineRequest, forced_tool: dict[str, Any] | None) -> None:
        self.request = request
        self.forced_tool = forced_tool
        self.completion_tokens = 0  # over every choice
        self._started: set[int] = set()  # choices that produced a token
        self._called: set[int] = set()  # choices whose answer made tool calls

    def output(
        self,
        comp: Any,
        calls: vllm_tools.ToolCallStream | None,
        prompt_ids: list[int],
        out: Any,
        request_finished: bool,
        decode: Callable[[list[int]], str],
    ) -> EngineOutput:
        """One choice's step (`comp`, a CompletionOutput of `out`, vLLM's RequestOutput)."""
        request, index = self.request, comp.index
        new_tokens = len(comp.token_ids)
        first = index not in self._started
        if new_tokens:
            self._started.add(index)
        self.completion_tokens += new_tokens
        ended = comp.finish_reason is not None
        if calls is not None:
            delta, tool_calls = calls.feed(comp.text, comp.token_ids, prompt_ids, ended)
        else:
            delta = "" if self.forced_tool else comp.text
            tool_calls = vllm_tools.forced_call_delta(
                f"{request.request_id}-{index}" if index else request.request_id, self.forced_tool, comp.text, first
            )
        if request.parallel_tool_calls is False and tool_calls:
            tool_calls = _first_call_only(tool_calls)
        if calls is not None and tool_calls:
            self._called.add(index)
        logprobs = (
            vllm_sampling.token_logprobs(comp.token_ids, comp.logprobs, request.top_logprobs or 0, decode)
            if request.logprobs
            else None
        )
        return EngineOutput(
            delta=delta,
            tool_calls=tool_calls,
            new_tokens=new_tokens,
            prompt_tokens=len(prompt_ids),
            completion_tokens=self.completion_tokens,
            cached_prompt_tokens=out.num_cached_tokens or 0,
            finished=request_finished,
            finish_reason=vllm_tools.finish_reason(comp.finish_reason, index in self._called) if ended else None,
            # vLLM counts this request's PREEMPTED events (RequestStateStats, with stats on).
            preemptions=getattr(out.metrics, "num_preemptions", 0),
            index=index,
            logprobs=logprobs,
        )

    def closing(self, prompt_ids: list[int], out: Any) -> EngineOutput:
        """The request's end where vLLM sends it without a choice (n > 1: each choice already ended)."""
        return EngineOutput(
            delta="",
            new_tokens=0,
            prompt_tokens=len(prompt_ids),
            completion_tokens=self.completion_tokens,
            cached_prompt_tokens=out.num_cached_tokens or 0,
            finished=True,
            preemptions=getattr(out.metrics, "num_preemptions", 0),
        )


def _first_call_only(calls: list[ToolCallDelta]) -> list[ToolCallDelta] | None:
    kept = [call for call in calls if call.index == 0]
    return kept or None
