"""What each engine can honour beyond plain text generation, read by the worker (which refuses a
request its engine cannot answer as asked) and the gateway (which answers 400 before the bus).

- `response_format` (JSON mode, JSON schema): vLLM's structured outputs, hosted APIs.
- `tools`: hosted APIs; vLLM, where the tools reach the model's chat template, a named
  `tool_choice` is answered as that call (arguments under structured outputs), and `auto` /
  `required` go through vLLM's tool-call parser when the worker has one (without one, `required`
  is a JSON array of calls and `auto` is text).
- `suffix` (fill-in-the-middle): completion APIs upstream; the sim, which only counts it as prompt;
  vLLM where the worker knows the model's FIM format (`LLMBUS_WORKER_VLLM_FIM_FORMAT`, or a model
  whose vLLM renderer has one).

A worker advertises what its engine honours in its heartbeat (`WorkerStatus.engine_features`), since
one engine kind differs by configuration (vLLM with or without a FIM format); a heartbeat without
that field is judged by the engine kind's defaults below.

The sim refuses `response_format` and `tools`: its text is synthetic, and JSON that merely looks
right would be a stub answering like the real thing.
"""

from __future__ import annotations

from collections.abc import Iterable

ENGINE_FEATURES: dict[str, frozenset[str]] = {
    "vllm": frozenset({"response_format", "tools"}),
    "openai-http": frozenset({"response_format", "tools", "suffix"}),
    "sim": frozenset({"suffix"}),
}


def features_of(engine: str, advertised: Iterable[str] | None = None) -> frozenset[str]:
    """What a worker's engine honours: what it advertised, else its kind's defaults (none if unknown)."""
    return frozenset(advertised) if advertised is not None else ENGINE_FEATURES.get(engine, frozenset())


def missing_features(engine: str, needed: Iterable[str], advertised: Iterable[str] | None = None) -> list[str]:
    """The features of `needed` that `engine` lacks, sorted (an unknown engine lacks them all)."""
    return sorted(set(needed) - features_of(engine, advertised))


def refusal(engine: str, model: str, missing: list[str]) -> str:
    return f"{', '.join(missing)} not supported by the {engine} engine serving {model!r}"
