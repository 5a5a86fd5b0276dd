"""Semantic cache, the pure part: which requests may use it, and the nearest entry above a threshold.

Same rules as the exact cache (only deterministic requests whose policy allows caching; the
tenant and the model are part of the index's name, so a hit never crosses tenants or models),
plus a length cap: a long prompt is not embedded. No broker imports, no Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from llmbus.contract.messages import InferenceRequest
from llmbus_services.router.core.cache_key import cacheable
from llmbus_services.router.core.config import RouterPolicy

Vector = npt.NDArray[np.float32]
SEMANTIC_HIT = "semantic_hit"  # route_reason prefix of an answer from the semantic cache


class Embedder(Protocol):
    name: str

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One L2-normalised row per text."""
        ...


def semantic_text(request: InferenceRequest) -> str:
    return request.prompt_text()


def eligible(request: InferenceRequest, policy: RouterPolicy) -> bool:
    sc = policy.semantic_cache
    return (
        sc.enabled
        and policy.cache.enabled
        and cacheable(request)
        and not request.engine_features()  # a JSON-shaped or tool answer is not a similar prompt's
        and len(semantic_text(request)) <= sc.max_prompt_chars
    )


def normalised(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return (rows / np.where(norms == 0, 1, norms)).astype(np.float32)


def nearest(query: Vector, entries: npt.NDArray[np.float32], threshold: float) -> tuple[int, float] | None:
    """Index and cosine similarity of the entry most similar to `query`, if at or above `threshold`."""
    if entries.size == 0:
        return None
    sims = entries @ query
    best = int(np.argmax(sims))
    similarity = float(sims[best])
    return (best, similarity) if similarity >= threshold else None
