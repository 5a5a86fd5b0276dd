"""Deterministic output text derived from the prompt: same prompt (and seed), same answer."""

from __future__ import annotations

import hashlib
import math
import random

WORDS = [
    "the",
    "a",
    "kafka",
    "stream",
    "token",
    "cache",
    "prefix",
    "block",
    "engine",
    "worker",
    "model",
    "batch",
    "queue",
    "latency",
    "throughput",
    "schedule",
    "route",
    "shadow",
    "tenant",
    "budget",
    "request",
    "result",
    "partition",
    "offset",
    "commit",
    "replica",
    "scale",
    "cluster",
    "node",
    "memory",
    "compute",
    "decode",
    "prefill",
    "attention",
    "layer",
]


def content_key(prompt: str, seed: int | None = None) -> str:
    """Names the answer: requests with equal keys generate equal tokens (and share KV blocks)."""
    return hashlib.blake2b(f"{seed}|{prompt}".encode(), digest_size=8).hexdigest()


def natural_answer_tokens(key: str, median_tokens: int, sigma: float = 0.8) -> int:
    """Where the answer named `key` would end on its own (the model's end-of-sequence token): a length drawn
    from a log-normal of `median_tokens`, the same for the same key. Chat answers are short with a long tail:
    in data/traces/azure-llm-2023-conv.csv the median is 129 generated tokens, the 90th percentile 424 and
    the 99th 601 (sigma 0.8 puts the 90th percentile at 2.8x the median)."""
    draw = random.Random(int(key, 16) ^ 0x5EED).lognormvariate(math.log(median_tokens), sigma)
    return max(1, round(draw))


def token_stream(prompt: str, seed: int | None = None, key: str | None = None) -> random.Random:
    """The answer's token draws; `key` is content_key(prompt, seed) when the caller has it already."""
    return random.Random(int(key or content_key(prompt, seed), 16))


# One pseudo-token: a short word piece, about 4 characters like a BPE token. Built once: a draw
# picks an index into this tuple exactly as it would into WORDS (same length, same stream).
_TOKEN_TEXTS = tuple(" " + word for word in WORDS)


def next_token_text(rng: random.Random) -> str:
    return rng.choice(_TOKEN_TEXTS)


class AnswerText:
    """An answer's tokens: the prompt's reference stream, each token swapped with probability `divergence`.

    Every model of the sim answers a prompt with the same reference tokens; a worse model
    (divergence > 0, per worker) drifts from them, deterministically per (model, prompt, seed),
    which is what makes shadow comparisons between sim models mean something.
    """

    def __init__(
        self,
        prompt: str,
        seed: int | None = None,
        divergence: float = 0.0,
        model: str = "",
        *,
        reference_key: str | None = None,  # content_key(prompt, seed), if known
    ) -> None:
        self._reference = token_stream(prompt, seed, reference_key)
        self._divergence = divergence
        self._noise = token_stream(f"{model}|{prompt}", seed) if divergence > 0 else None

    def next_token(self) -> str:
        token = self._reference.choice(_TOKEN_TEXTS)  # always drawn: the reference stays aligned
        if self._noise is not None and self._noise.random() < self._divergence:
            return next_token_text(self._noise)
        return token

    def next_tokens(self, count: int) -> str:
        """The text of the next `count` tokens (one engine step's worth for a request)."""
        if count == 1:
            return self.next_token()
        return "".join([self.next_token() for _ in range(count)])
