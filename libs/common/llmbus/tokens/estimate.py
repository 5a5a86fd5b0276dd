"""A token count without the model's tokenizer: text cut into runs by script, each run priced.

Four characters per token holds for English prose only: a Han character is about one token,
a Cyrillic word two or three, every digit one in modern BPE vocabularies, and code's punctuation
and indentation a token each. So text is cut into runs the way BPE pre-tokenizers cut it (a word
of one script, a digit, a CJK character, a newline with its indentation, one punctuation mark)
and each kind of run has its own price in tokens, fitted against a real tokenizer.

Calibration: the prices below are non-negative least squares (relative error) against the
Tekken tokenizer of Mistral NeMo, `tekken_240911.json` (131,072 tokens), shipped as package data
by `mistral-common` 1.13.1 (PyPI, Apache-2.0), on the mixed corpus data/tokens/corpus.jsonl.
`python -m bench.tokens_estimator --fit` refits them and prints this table; its report
(bench/reports/tokens_estimator.md) gives the error per script.
"""

from __future__ import annotations

import math
import re

# The kinds of run, as character classes; they are disjoint, so each is counted on its own by one
# C-level regex pass (a Python loop over the matches would cost ~10x as much on long prompts).
_WORD_CLASSES = {
    "latin_word": "A-Za-z\u00c0-\u024f",
    "cyrillic_word": "\u0400-\u04ff",
    "other_word": "\u0370-\u03ff\u0590-\u06ff\u0900-\u0dff\u0e00-\u0e7f",  # Greek, Hebrew, Arabic, Indic, Thai
}
_CHAR_CLASSES = {
    "digit": "0-9",
    "han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff",
    "kana": "\u3040-\u30ff",
    "hangul": "\uac00-\ud7af\u1100-\u11ff",
    "emoji": "\U0001f000-\U0001faff\u2600-\u27bf",
}
_WORD_RUNS = {kind: re.compile(f"[{chars}]+") for kind, chars in _WORD_CLASSES.items()}
_CHARS = {kind: re.compile(f"[{chars}]") for kind, chars in _CHAR_CLASSES.items()}

# Word runs are priced per run plus per character (a long word is split into more pieces).
FEATURES = (
    *(f for kind in _WORD_CLASSES for f in (kind, f"{kind}_chars")),
    *_CHAR_CLASSES,
    "newline",
    "other",
)

# Tokens per feature unit, fitted by bench/tokens_estimator.py --fit (see the module docstring).
PRICES: dict[str, float] = {
    "latin_word": 0.111,
    "latin_word_chars": 0.226,
    "cyrillic_word": 2.294,
    "cyrillic_word_chars": 0.0,
    "other_word": 1.008,
    "other_word_chars": 0.195,
    "digit": 1.446,
    "han": 0.916,
    "kana": 0.699,
    "hangul": 0.7,
    "emoji": 2.787,
    "newline": 0.86,
    "other": 0.488,
}


def features(text: str) -> dict[str, int]:
    """How many runs (and word characters) of each kind `text` has. Spaces and tabs count for
    nothing (they join the word after them, as in BPE vocabularies); a newline with the indentation
    after it is one run; every other character (punctuation, symbols) is one run of its own."""
    counts = dict.fromkeys(FEATURES, 0)
    classified = 0
    for kind, pattern in _WORD_RUNS.items():
        runs = pattern.findall(text)
        counts[kind] = len(runs)
        counts[f"{kind}_chars"] = chars = sum(map(len, runs))
        classified += chars
    for kind, pattern in _CHARS.items():
        counts[kind] = n = len(pattern.findall(text))
        classified += n
    counts["newline"] = newlines = text.count("\n")
    blanks = text.count(" ") + text.count("\t")
    counts["other"] = len(text) - classified - newlines - blanks
    return counts


def estimate_tokens(text: str, prices: dict[str, float] | None = None) -> int:
    if not text:
        return 0
    prices = prices or PRICES
    total = sum(prices[name] * n for name, n in features(text).items() if n)
    return max(1, math.ceil(total))
