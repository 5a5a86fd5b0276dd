"""Semantic cache: precision and hit rate of the packaged embedder on paraphrase pairs, per threshold.

Pairs: llmbus_tools/router_training/data/paraphrase_pairs.jsonl (paraphrases, near misses, unrelated; see its
README). A pair counts as a hit when the cosine similarity of its two prompts' embeddings is at or
above the threshold; precision = hits that are paraphrases / hits (a wrong hit serves another
question's answer); hit rate (recall) = paraphrases hit / paraphrases. The recommended threshold
is the lowest one whose precision is >= `min_precision` — None when no threshold reaches it with
any hit at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from llmbus_services.router.adapters.embedders import build_embedder

PAIRS = Path(__file__).resolve().parents[1] / "services" / "router" / "data" / "paraphrase_pairs.jsonl"
THRESHOLDS = [round(0.5 + 0.02 * i, 2) for i in range(26)]  # 0.50 .. 1.00


def load_pairs(path: Path = PAIRS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def curve(similarities: list[float], same: list[bool], thresholds: list[float]) -> list[dict]:
    rows = []
    positives = sum(same)
    for threshold in thresholds:
        hits = [s for sim, s in zip(similarities, same, strict=True) if sim >= threshold]
        true_hits = sum(hits)
        rows.append(
            {
                "threshold": threshold,
                "hits": len(hits),
                "precision": round(true_hits / len(hits), 3) if hits else None,
                "hit_rate": round(true_hits / positives, 3) if positives else 0.0,
            }
        )
    return rows


def recommended(rows: list[dict], min_precision: float) -> dict | None:
    for row in rows:  # lowest threshold first: the most hits at that precision
        if row["hits"] and row["precision"] is not None and row["precision"] >= min_precision:
            return row
    return None


def evaluate(embedder_name: str = "wordllama", min_precision: float = 0.95) -> dict:
    pairs = load_pairs()
    embedder = build_embedder(embedder_name)
    a = embedder.embed([p["a"] for p in pairs])
    b = embedder.embed([p["b"] for p in pairs])
    similarities = [float(x) for x in np.sum(a * b, axis=1)]
    same = [bool(p["same_answer"]) for p in pairs]
    by_kind: dict[str, dict[str, float]] = {}
    for kind in sorted({p["kind"] for p in pairs}):
        sims = sorted(s for s, p in zip(similarities, pairs, strict=True) if p["kind"] == kind)
        by_kind[kind] = {"n": len(sims), "min": round(sims[0], 3), "median": round(sims[len(sims) // 2], 3)}
        by_kind[kind]["max"] = round(sims[-1], 3)
    rows = curve(similarities, same, THRESHOLDS)
    return {
        "embedder": embedder_name,
        "pairs": len(pairs),
        "min_precision": min_precision,
        "similarity_by_kind": by_kind,
        "curve": rows,
        "recommended": recommended(rows, min_precision),
    }


if __name__ == "__main__":
    print(json.dumps(evaluate(), indent=2))
