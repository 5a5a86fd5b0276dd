"""Semantic cache, the pure part and its place in the pipeline; the packaged embedder loads offline."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from llmbus.contract.messages import InferenceRequest, Usage
from llmbus_services.router.adapters.embedders import build_embedder
from llmbus_services.router.core.complexity import build_scorer
from llmbus_services.router.core.config import RouterPolicy, load_policy
from llmbus_services.router.core.pipeline import RouterCore
from llmbus_services.router.core.ports import CachedAnswer, SemanticProbe
from llmbus_services.router.core.semantic import eligible, nearest, normalised


def policy_with(**semantic: object) -> RouterPolicy:
    raw = load_policy().model_dump(mode="json")
    raw["semantic_cache"] |= {"enabled": True} | semantic
    return RouterPolicy.model_validate(raw)


class NoExactCache:
    async def lookup(self, key: str, pending_id: str | None = None) -> CachedAnswer | None:
        return None


class FakeSemantic:
    def __init__(self, answer: CachedAnswer | None) -> None:
        self.answer = answer
        self.asked: list[str] = []
        self.pending: list[tuple[str, str, str]] = []

    async def lookup(self, request: InferenceRequest, model: str) -> SemanticProbe:
        self.asked.append(request.request_id)
        return SemanticProbe(self.answer, 0.991 if self.answer else 0.0, np.zeros(4, dtype=np.float32))

    async def remember_pending(
        self, request_id: str, key: str, tenant: str, model: str, vector: npt.NDArray[np.float32]
    ) -> None:
        self.pending.append((request_id, tenant, model))


def ask(request_id: str, **fields: object) -> InferenceRequest:
    base: dict[str, object] = {"prompt": "What is Kafka?", "temperature": 0.0, "tenant": "acme"}
    return InferenceRequest(request_id=request_id, **(base | fields))  # type: ignore[arg-type]


def test_eligibility_follows_the_cache_rules() -> None:
    on = policy_with(max_prompt_chars=100)
    assert eligible(ask("a"), on)
    assert not eligible(ask("b", temperature=0.7), on)  # sampled: never cached
    assert not eligible(ask("c", prompt="x" * 101), on)  # too long to embed
    assert not eligible(ask("d"), load_policy())  # off by default
    cache_off = on.model_copy(update={"cache": on.cache.model_copy(update={"enabled": False})})
    assert not eligible(ask("e"), cache_off)


def test_nearest_takes_the_most_similar_entry_at_or_above_the_threshold() -> None:
    entries = normalised(np.array([[1, 0, 0], [0.8, 0.6, 0], [0, 0, 1]], dtype=np.float32))
    query = normalised(np.array([[0.9, 0.44, 0]], dtype=np.float32))[0]
    best = nearest(query, entries, 0.9)
    assert best is not None and best[0] == 1 and best[1] > 0.98
    assert nearest(query, entries, 0.9999) is None
    assert nearest(query, np.zeros((0, 3), dtype=np.float32), 0.5) is None


async def test_a_semantic_hit_answers_marked_as_such_and_a_miss_is_remembered() -> None:
    answer = CachedAnswer(text="a log", usage=Usage(prompt_tokens=4, completion_tokens=2), model="gpt-4.1-mini")
    hit_cache = FakeSemantic(answer)
    core = RouterCore(policy_with(), build_scorer("heuristic"), cache=NoExactCache(), semantic=hit_cache)
    hit = await core.route(ask("h"))
    assert hit.result is not None and hit.result.cached and hit.result.text == "a log"
    assert hit.result.route_reason is not None and hit.result.route_reason.startswith("semantic_hit:0.991:")
    assert hit.result.request_id == "h" and hit.result.tenant == "acme"

    miss_cache = FakeSemantic(None)
    core = RouterCore(policy_with(), build_scorer("heuristic"), cache=NoExactCache(), semantic=miss_cache)
    miss = await core.route(ask("m"))
    assert miss.routed is not None and miss_cache.pending == [("acme:m", "acme", miss.routed.model)]
    sampled = await core.route(ask("s", temperature=0.9))
    assert sampled.routed is not None and miss_cache.asked == ["m"]  # a sampled request never asks


def test_the_packaged_embedder_loads_without_downloading() -> None:
    embedder = build_embedder("wordllama")
    rows = embedder.embed(["What is Kafka?", "Explain Apache Kafka", "Bake bread at home"])
    assert rows.shape == (3, 256) and rows.dtype == np.float32
    assert np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-4)
    assert rows[0] @ rows[1] > rows[0] @ rows[2]
