"""A request's SamplingParams, as `vllm serve` makes them, and its log-probabilities back in OpenAI's shape.

A parameter the request sets wins; one it leaves unset takes the model's default from its generation
config (`ModelConfig.get_diff_sampling_param()`, which `vllm serve` and `LLM.generate` read: the
model's `generation_config.json` under vLLM's default `--generation-config auto`), else vLLM's OpenAI
server's neutral value (`ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS`), computed once. An unset max_tokens takes
what the window leaves, bounded by the output cap and by the generation config's `max_new_tokens`
(vLLM's `get_max_tokens`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from llmbus.contract.messages import TokenLogprob, TopLogprob
from llmbus_services.engine_worker.core.engine import EngineRequest, answer_room

# The sampling parameters a generation config may set (ModelConfig.get_diff_sampling_param's list).
SAMPLING_NAMES: tuple[str, ...] = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty")
SAMPLING_NAMES += ("repetition_penalty",)


@functools.cache
def neutral_sampling() -> dict[str, Any]:
    """vLLM's OpenAI server's values for what neither the request nor the model sets."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    # A pydantic private attribute of the request model: its value is the attribute's default.
    return dict(ChatCompletionRequest.__private_attributes__["_DEFAULT_SAMPLING_PARAMS"].get_default())


def chosen_sampling(request: EngineRequest, model_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Each sampling parameter: the request's, else the model's generation config's, else vLLM's neutral."""
    neutral = neutral_sampling()
    chosen = {}
    for name in SAMPLING_NAMES:
        value = getattr(request, name)
        chosen[name] = value if value is not None else model_defaults.get(name, neutral.get(name))
    return chosen


def max_tokens_for(
    request: EngineRequest, prompt_tokens: int, max_model_len: int, model_defaults: Mapping[str, Any]
) -> int:
    """The answer's bound: as asked; or, unset, what the window leaves of the output cap and of the
    generation config's max_new_tokens."""
    room = answer_room(prompt_tokens, request.max_tokens, request.max_tokens_auto, max_model_len)
    default = model_defaults.get("max_tokens")
    return min(room, int(default)) if request.max_tokens_auto and default else room


def sampling_params(
    request: EngineRequest, max_tokens: int, model_defaults: Mapping[str, Any], **engine_params: Any
) -> Any:
    """vLLM's SamplingParams for the request (`engine_params`: the engine's own, e.g. output_kind)."""
    from vllm import SamplingParams

    return SamplingParams.from_optional(
        n=request.n,
        **chosen_sampling(request, model_defaults),
        max_tokens=max_tokens,
        seed=request.seed,
        stop=list(request.stop) or None,
        logprobs=(request.top_logprobs or 0) if request.logprobs else None,
        logit_bias=request.logit_bias,
        **engine_params,
    )


def token_logprobs(
    token_ids: Sequence[int], steps: Sequence[Mapping[int, Any] | None] | None, top_n: int, decode: Any
) -> list[TokenLogprob] | None:
    """OpenAI's `logprobs.content[]` of one step's tokens from vLLM's per-token {token id: Logprob} (the
    sampled token's entry and the top alternatives), the alternatives by vLLM's rank."""
    if steps is None:
        return None
    out = []
    for token_id, step in zip(token_ids, steps, strict=False):
        step = step or {}
        chosen = step.get(token_id)
        token = _text_of(token_id, chosen, decode)
        alternatives = sorted(step.items(), key=lambda item: item[1].rank or 0)[:top_n]
        out.append(
            TokenLogprob(
                token=token,
                logprob=max(chosen.logprob, -9999.0) if chosen is not None else -9999.0,
                bytes=list(token.encode("utf-8", errors="replace")),
                top_logprobs=[
                    TopLogprob(
                        token=(alt := _text_of(alt_id, entry, decode)),
                        logprob=max(entry.logprob, -9999.0),
                        bytes=list(alt.encode("utf-8", errors="replace")),
                    )
                    for alt_id, entry in alternatives
                ],
            )
        )
    return out


def _text_of(token_id: int, entry: Any, decode: Any) -> str:
    decoded = getattr(entry, "decoded_token", None)
    return str(decoded) if decoded is not None else str(decode([token_id]))
