"""What each engine can honour beyond plain text generation, read by the worker (which refuses a
request its engine cannot answer as asked) and the gateway (which answers 400 before the bus).

A feature is named as the OpenAI API names the parameter that asks for it
(InferenceRequest.engine_features), so a refusal names the parameter:

- `response_format` (JSON mode, JSON schema): vLLM's structured outputs, hosted APIs.
- `tools`: hosted APIs; vLLM, where the tools reach the model's chat template, a named
  `tool_choice` is answered as that call (arguments under structured outputs), and `auto` /
  `required` go through vLLM's tool-call parser when the worker has one (without one, `required`
  is a JSON array of calls and `auto` is text). `parallel_tool_calls: false` keeps the first call,
  as vLLM's server does.
- `suffix` (fill-in-the-middle): completion APIs upstream; the sim, which only counts it as prompt;
  vLLM where the worker knows the model's FIM format (`LLMBUS_WORKER_VLLM_FIM_FORMAT`, or a model
  whose vLLM renderer has one).
- `n`, `logprobs` (with `top_logprobs`), `presence_penalty`, `frequency_penalty`, `logit_bias`,
  `reasoning_effort` and vLLM's sampling extras `top_k`, `min_p`, `repetition_penalty`: vLLM's
  SamplingParams (reasoning_effort: the chat template's variable), and forwarded to a hosted
  upstream unless its settings list the parameter as one it refuses.
- `image_url` (image content parts): hosted upstreams only; the vLLM engine serves text-only models.

The onnx engine (onnxruntime-genai on CPU nodes) serves plain text: of the sampling extras it takes
`top_k` and `repetition_penalty`, which its generator's search options have.

A worker advertises what its engine honours in its heartbeat (`WorkerStatus.engine_features`), since
one engine kind differs by configuration (vLLM with or without a FIM format, an upstream that refuses
vLLM's extras); a heartbeat without that field is judged by the engine kind's defaults below.

The sim's text is synthetic: it takes the sampling knobs that only shape a distribution it does not
have (penalties, top_k, min_p, repetition_penalty: the text is the same with or without them), and
refuses what would need a real model to be true (JSON, tools, several choices, log-probabilities,
token biases, reasoning, images): an answer that merely looks right would be a stub answering like
the real thing.
"""

from __future__ import annotations

from collections.abc import Iterable

# Sampling parameters vLLM, a hosted upstream and the sim take: they change how a real model samples, and
# the sim's text does not depend on them.
SAMPLING_KNOBS = frozenset({"presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty"})
# onnxruntime-genai's generator takes these two of them (no penalties on presence or frequency, no min_p).
ONNX_SAMPLING_KNOBS = frozenset({"top_k", "repetition_penalty"})
VLLM_PARAMETERS = SAMPLING_KNOBS | {"n", "logprobs", "logit_bias", "parallel_tool_calls", "reasoning_effort"}

ENGINE_FEATURES: dict[str, frozenset[str]] = {
    "vllm": frozenset({"response_format", "tools"}) | VLLM_PARAMETERS,
    "openai-http": frozenset({"response_format", "tools", "suffix", "image_url"}) | VLLM_PARAMETERS,
    "sim": frozenset({"suffix"}) | SAMPLING_KNOBS,
    # plain text: no grammar, no template tools, no FIM format; onnxruntime-genai's search options sample
    "onnx": ONNX_SAMPLING_KNOBS,
}


def features_of(engine: str, advertised: Iterable[str] | None = None) -> frozenset[str]:
    """What a worker's engine honours: what it advertised, else its kind's defaults (none if unknown)."""
    return frozenset(advertised) if advertised is not None else ENGINE_FEATURES.get(engine, frozenset())


def missing_features(engine: str, needed: Iterable[str], advertised: Iterable[str] | None = None) -> list[str]:
    """The features of `needed` that `engine` lacks, sorted (an unknown engine lacks them all)."""
    return sorted(set(needed) - features_of(engine, advertised))


def refusal(engine: str, model: str, missing: list[str]) -> str:
    return f"{', '.join(missing)} not supported by the {engine} engine serving {model!r}"
