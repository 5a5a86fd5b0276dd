"""Complexity scorers: a Protocol, a registry, and `build_scorer` from the policy's `scorer:` block.

A scorer maps a request to [0, 1] ("how much would a stronger model help"). The rules
compare it with thresholds (the seed: > 0.8 goes to the strong model). A trained
classifier plugs in by registering a class with the same `score` method, e.g.

    @SCORERS.register("distilbert")
    class DistilBertScorer:
        def __init__(self, model_dir: str) -> None: ...
        def score(self, request: InferenceRequest) -> float: ...

and naming it in the YAML (`scorer: {name: distilbert, params: {model_dir: ...}}`).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, runtime_checkable

from llmbus.contract.messages import InferenceRequest
from llmbus.contract.plugins import Registry


@runtime_checkable
class ComplexityScorer(Protocol):
    name: str

    def score(self, request: InferenceRequest) -> float: ...


log = logging.getLogger(__name__)
SCORERS: Registry[ComplexityScorer] = Registry("complexity scorer")


def build_scorer(name: str, params: dict[str, Any] | None = None) -> ComplexityScorer:
    """The scorer `name` with `params` checked against its own (llmbus.contract.plugins)."""
    # Importing here registers the shipped scorers without an import cycle.
    from llmbus_services.router.core import heuristic, learned  # noqa: F401

    return SCORERS.build(name, params)


def build_scorer_with_fallback(name: str, params: dict[str, Any] | None, fallback: str | None) -> ComplexityScorer:
    """`build_scorer(name, params)`, or the `fallback` scorer when that fails (logged, never silent)."""
    try:
        return build_scorer(name, params)
    except (OSError, ValueError, KeyError, TypeError):
        if fallback is None:
            raise
        log.exception("complexity scorer %r could not be built; using the fallback %r", name, fallback)
        return build_scorer(fallback)


def scorer_names() -> list[str]:
    from llmbus_services.router.core import heuristic, learned  # noqa: F401

    return SCORERS.names()


@SCORERS.register("constant")
class ConstantScorer:
    """Always the same score: for tests and for turning complexity routing off."""

    name = "constant"

    def __init__(self, value: float = 0.5) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError("value must be in [0, 1]")
        self.value = value

    def score(self, request: InferenceRequest) -> float:
        return self.value
