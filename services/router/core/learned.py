"""The learned complexity scorer: a logistic regression over sparse prompt features, scored in pure Python.

Training (llmbus_tools/router_training/, scikit-learn) and scoring share `featurize`, so the
features the model was fitted on are exactly the ones it sees at request time. The model
file is JSON — format version, bias, one weight per feature name, and the provenance of
the fit (seed, corpus digest, held-out metrics) — never a pickle: it is diffable, versioned
in git, and loads without scikit-learn.

Features (all in [0, 1] or binary):
- `w:<word>` / `b:<word>_<word>`: words and word pairs of the scored text (the first
  `_HEAD_WORDS` and last `_TAIL_WORDS` words only, so a huge prompt costs what a page costs);
- `h:<cue>`: the heuristic's hand features (length, code, reasoning, multi_step, math,
  constraints, simple) — the learned model reweights them instead of starting from zero;
- `cat:<category>`, `depth` (user turns beyond the first, saturating at 4), `sys` (a system prompt).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from llmbus.contract.messages import InferenceRequest
from llmbus_services.router.core.complexity import SCORERS
from llmbus_services.router.core.heuristic import _WORD, features_of

MODEL_FORMAT = 1
DEFAULT_MODEL_PATH = Path(__file__).resolve().parent.parent / "policies" / "scorer_model.json"
_HEAD_WORDS = 256
_TAIL_WORDS = 64
_SCAN_CHARS = 4000  # enough characters for the head and tail words above


def scored_text_and_depth(request: InferenceRequest) -> tuple[str, int, bool]:
    """The text the scorer reads, how many user turns precede the last one, and whether a system prompt is set."""
    if request.prompt is not None:
        return request.prompt, 0, False
    users = [m.content for m in request.messages if m.role == "user"]
    text = "\n".join(m.content for m in request.messages if m.role in ("system", "user", "tool"))
    return text, max(0, len(users) - 1), any(m.role == "system" for m in request.messages)


def featurize_text(text: str, category: str | None, depth: int, has_system: bool) -> dict[str, float]:
    feats: dict[str, float] = {f"h:{k}": v for k, v in features_of(text).items()}
    scanned = text if len(text) <= _SCAN_CHARS else text[: _SCAN_CHARS // 2] + " " + text[-_SCAN_CHARS // 4 :]
    words = _WORD.findall(scanned.lower())
    if len(words) > _HEAD_WORDS + _TAIL_WORDS:
        words = words[:_HEAD_WORDS] + words[-_TAIL_WORDS:]
    for w in words:
        feats["w:" + w] = 1.0
    for a, b in itertools.pairwise(words):
        feats["b:" + a + "_" + b] = 1.0
    feats["cat:" + (category or "none")] = 1.0
    feats["depth"] = min(depth, 4) / 4
    if has_system:
        feats["sys"] = 1.0
    return feats


def featurize(request: InferenceRequest) -> dict[str, float]:
    text, depth, has_system = scored_text_and_depth(request)
    return featurize_text(text, request.category, depth, has_system)


class ScorerModel:
    """A fitted model: bias + sparse weights by feature name (the JSON file's content)."""

    def __init__(self, bias: float, weights: dict[str, float], meta: dict[str, Any] | None = None) -> None:
        self.bias = bias
        self.weights = weights
        self.meta = meta or {}

    def logit_of(self, feats: dict[str, float]) -> float:
        get = self.weights.get
        return self.bias + sum(get(k, 0.0) * v for k, v in feats.items())

    def prob_of(self, feats: dict[str, float]) -> float:
        z = max(-50.0, min(50.0, self.logit_of(feats)))
        return 1.0 / (1.0 + math.exp(-z))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MODEL_FORMAT,
            "meta": self.meta,
            "bias": round(self.bias, 6),
            "weights": {k: round(v, 6) for k, v in sorted(self.weights.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ScorerModel:
        if data.get("format") != MODEL_FORMAT:
            raise ValueError(f"scorer model format {data.get('format')!r}, expected {MODEL_FORMAT}")
        return cls(float(data["bias"]), {k: float(v) for k, v in data["weights"].items()}, data.get("meta", {}))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=0, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ScorerModel:
        return cls.from_json(json.loads(Path(path).read_text()))


@SCORERS.register("learned")
class LearnedScorer:
    name = "learned"

    def __init__(self, model_path: str | None = None) -> None:
        self.model_path = Path(model_path) if model_path else DEFAULT_MODEL_PATH
        self.model = ScorerModel.load(self.model_path)

    @property
    def version(self) -> str:
        return str(self.model.meta.get("version", "unknown"))

    def score(self, request: InferenceRequest) -> float:
        return self.model.prob_of(featurize(request))
