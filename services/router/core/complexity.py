"""Complexity scorers: a Protocol, a registry, and `build_scorer` from the policy's `scorer:` block.

A scorer maps a request to [0, 1] ("how much would a stronger model help"). The rules
compare it with thresholds (the seed: > 0.8 goes to the strong model). A trained
classifier plugs in by registering a class with the same `score` method, e.g.

    @register_scorer("distilbert")
    class DistilBertScorer:
        def __init__(self, model_dir: str) -> None: ...
        def score(self, request: InferenceRequest) -> float: ...

and naming it in the YAML (`scorer: {name: distilbert, params: {model_dir: ...}}`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from llmbus.contract.messages import InferenceRequest


@runtime_checkable
class ComplexityScorer(Protocol):
    name: str

    def score(self, request: InferenceRequest) -> float: ...


log = logging.getLogger(__name__)
_REGISTRY: dict[str, Callable[..., ComplexityScorer]] = {}


def register_scorer(name: str) -> Callable[[Callable[..., ComplexityScorer]], Callable[..., ComplexityScorer]]:
    def _register(factory: Callable[..., ComplexityScorer]) -> Callable[..., ComplexityScorer]:
        _REGISTRY[name] = factory
        return factory

    return _register


def build_scorer(name: str, params: dict[str, Any] | None = None) -> ComplexityScorer:
    # Importing here registers the shipped scorers without an import cycle.
    from llmbus_services.router.core import heuristic, learned  # noqa: F401

    if name not in _REGISTRY:
        raise KeyError(f"unknown complexity scorer {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name](**(params or {}))


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

    return sorted(_REGISTRY)


@register_scorer("constant")
class ConstantScorer:
    """Always the same score: for tests and for turning complexity routing off."""

    name = "constant"

    def __init__(self, value: float = 0.5) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError("value must be in [0, 1]")
        self.value = value

    def score(self, request: InferenceRequest) -> float:
        return self.value
