"""The shipped complexity heuristic: cheap text cues combined in a logistic score.

score = sigmoid(bias + sum(weight_i * feature_i)), each feature in [0, 1] except the
simplicity cue and the category prior, which pull down. The features and why:

- length: log-scaled prompt tokens; long inputs (documents, big diffs) need more context work.
- code: code fences / code-like lines; code alone is not hard (a rename is code), so the weight is small.
- reasoning: "why / prove / trade-off / design / debug ..." asks for analysis, not recall.
- multi_step: numbered lists, "step by step", "then ... finally", several questions.
- math: formulas, LaTeX, proof and probability vocabulary.
- constraints: "must / at most / without / exactly / O(n)" — each one is a way to be wrong.
- simple: "fix the typo / rename / translate / what is ..." — recall or mechanical edits.
- category prior: editor traffic (quick_edit, tab_completion) is latency-bound and simple by contract.

The weights were set by reasoning about the cues, not fitted to the labelled set in
`llmbus_tools/router_training/data/complexity_labelled.jsonl`; `bench/router_complexity.py` measures
how well they agree with it. One revision was made after the first measurement (v1:
accuracy 0.687, AUC 0.969 — it ranked well but scored too low to cross 0.8): bias -2.5 →
-2.0, length reference 4,000 → 1,000 tokens, reasoning saturating at 2 cues instead of 3,
and the simplicity cue only counting in short prompts (then 0.776 accuracy, 1.0
precision, 0.44 recall of "high" at 0.8, AUC 0.986: it ranks well but is conservative at
0.8). Those numbers are therefore in-sample; a held-out set (or a trained classifier)
is the honest next step.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from llmbus.contract.messages import InferenceRequest
from llmbus.tokens import estimate_tokens
from llmbus_services.router.core.complexity import SCORERS

# Cues are matched on lower-cased words (one regex pass, then set lookups) and phrases
# (substring counts): an alternation of ~30 words under IGNORECASE cost ~40 µs per
# pattern per prompt in `re`, which at thousands of requests/s is most of the router.
_WORD = re.compile(r"[a-z0-9]+(?:[-'][a-z0-9]+)*")


def _words(spaced: str) -> frozenset[str]:
    return frozenset(spaced.split())


_REASONING_WORDS = _words(
    "why explain prove proof derive analyze analyse analysis compare contrast evaluate justify "
    "tradeoff tradeoffs trade-off trade-offs design optimize optimise debug reason reasoning "
    "implication implications critique strategy diagnose refactor deadlock scale scaling scalable"
)
_REASONING_PREFIXES = ("architect", "migrat", "concurren")
_REASONING_PHRASES = ("root cause", "race condition")
_MULTI_STEP_WORDS = frozenset({"first", "then", "finally"})
_MULTI_STEP_PHRASES = ("step by step", "step-by-step", "after that", "next,")
_LIST_ITEM = re.compile(r"^[ \t]*(?:\d+[.)]|[-*])[ \t]+\S", re.MULTILINE)
_MATH_WORDS = _words("integral derivative theorem lemma matrix probability variance induction modulo prime asymptotic")
_MATH_PREFIXES = ("eigen", "converge")
_MATH_PHRASES = ("expected value", "\\frac", "\\sum", "\\int", "∫", "∑", "√")
_MATH_PATTERN = re.compile(r"\$[^$\n]+\$|\d\s*[\^*/=]\s*\d")
_CONSTRAINT_WORDS = _words(
    "must exactly without ensure guarantee constraint constraints requirement requirements thread-safe idempotent"
)
_CONSTRAINT_PHRASES = (
    "should not",
    "at most",
    "at least",
    "no more than",
    "only use",
    "backward compatible",
    "backwards compatible",
    "backward-compatible",
    "backwards-compatible",
)
_BIG_O = re.compile(r"O\([^)]*\)")
_SIMPLE_WORDS = _words(
    "typo rename translate define spell convert reformat thanks hello hi synonym autocomplete uppercase lowercase tldr"
)
_SIMPLE_PHRASES = (
    "what is",
    "what's",
    "capital of",
    "format this",
    "one sentence",
    "tl;dr",
    "thank you",
    "fix the indentation",
    "add a comment",
    "complete this",
)
_CODE = re.compile(
    r"```|^[ \t]*(?:def|class|function|import|from|return|const|let|var|public|#include)\b|[{};][ \t]*$", re.MULTILINE
)
# Long inputs are scanned at head and tail only: the ask is usually at one end, and the
# cost per request stays bounded whatever the prompt size (8 KB scanned: ~0.4 ms for a
# 100 KB prompt, under the 1 ms p99 budget; no training prompt is that long).
_SCAN_CHARS = 4000


def _count(
    counts: Counter[str],
    lower: str,
    vocab: frozenset[str],
    prefixes: tuple[str, ...] = (),
    phrases: tuple[str, ...] = (),
) -> int:
    """Words in `vocab` or starting with one of `prefixes`, plus phrase occurrences: over the
    distinct words (C-level counting), not once per word in Python."""
    n = sum(counts[w] for w in vocab & counts.keys())
    if prefixes:
        n += sum(c for w, c in counts.items() if w not in vocab and w.startswith(prefixes))
    return n + sum(lower.count(p) for p in phrases)


DEFAULT_WEIGHTS: dict[str, float] = {
    "bias": -2.0,
    "length": 1.5,
    "code": 0.5,
    "reasoning": 2.5,
    "multi_step": 1.5,
    "math": 2.0,
    "constraints": 1.2,
    "simple": -1.5,
}
DEFAULT_CATEGORY_PRIORS: dict[str, float] = {"quick_edit": -2.0, "tab_completion": -3.0}


def _saturate(count: int, at: int) -> float:
    return min(count, at) / at


def features_of(text: str) -> dict[str, float]:
    tokens = estimate_tokens(text)
    if len(text) > 2 * _SCAN_CHARS:
        text = text[:_SCAN_CHARS] + "\n" + text[-_SCAN_CHARS:]
    lower = text.lower()
    words = Counter(_WORD.findall(lower))
    reasoning = _count(words, lower, _REASONING_WORDS, _REASONING_PREFIXES, _REASONING_PHRASES)
    multi_step = _count(words, lower, _MULTI_STEP_WORDS, (), _MULTI_STEP_PHRASES) + len(_LIST_ITEM.findall(text))
    math_cues = _count(words, lower, _MATH_WORDS, _MATH_PREFIXES, _MATH_PHRASES) + len(_MATH_PATTERN.findall(text))
    constraints = _count(words, lower, _CONSTRAINT_WORDS, (), _CONSTRAINT_PHRASES) + len(_BIG_O.findall(text))
    simple = _count(words, lower, _SIMPLE_WORDS, (), _SIMPLE_PHRASES)
    return {
        # 0 at ~0 tokens, 1 at ~1,000 tokens (a long spec, a document, a large diff).
        "length": min(1.0, math.log1p(tokens / 50) / math.log1p(1000 / 50)),
        "code": _saturate(len(_CODE.findall(text)), 3),
        "reasoning": _saturate(reasoning, 2),
        "multi_step": _saturate(multi_step + max(0, text.count("?") - 1), 3),
        "math": _saturate(math_cues, 2),
        "constraints": _saturate(constraints, 3),
        # "translate" or "what is" marks an easy ask only in a short prompt; inside a long,
        # constrained request it is one step among many.
        "simple": _saturate(simple, 1) * max(0.0, 1.0 - tokens / 80),
    }


def _scored_text(request: InferenceRequest) -> str:
    # The assistant's own earlier turns say little about how hard the next answer is.
    if request.prompt is not None:
        return request.prompt
    return "\n".join(m.content for m in request.messages if m.role in ("system", "user", "tool"))


@SCORERS.register("heuristic")
class HeuristicScorer:
    name = "heuristic"

    def __init__(
        self, weights: dict[str, float] | None = None, category_priors: dict[str, float] | None = None
    ) -> None:
        self.weights = DEFAULT_WEIGHTS | (weights or {})
        self.category_priors = DEFAULT_CATEGORY_PRIORS | (category_priors or {})

    def logit(self, request: InferenceRequest) -> float:
        feats = features_of(_scored_text(request))
        z = self.weights["bias"] + sum(self.weights[k] * v for k, v in feats.items())
        return z + self.category_priors.get(request.category or "", 0.0)

    def score(self, request: InferenceRequest) -> float:
        return 1.0 / (1.0 + math.exp(-self.logit(request)))
