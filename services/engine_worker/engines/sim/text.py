"""Deterministic output text derived from the prompt: same prompt (and seed), same answer."""

from __future__ import annotations

import hashlib
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


def token_stream(prompt: str, seed: int | None = None) -> random.Random:
    return random.Random(int(content_key(prompt, seed), 16))


def next_token_text(rng: random.Random) -> str:
    # One pseudo-token: a short word piece, about 4 characters like a BPE token.
    return " " + rng.choice(WORDS)


class AnswerText:
    """An answer's tokens: the prompt's reference stream, each token swapped with probability `divergence`.

    Every model of the sim answers a prompt with the same reference tokens; a worse model
    (divergence > 0, per worker) drifts from them, deterministically per (model, prompt, seed),
    which is what makes shadow comparisons between sim models mean something.
    """

    def __init__(self, prompt: str, seed: int | None = None, divergence: float = 0.0, model: str = "") -> None:
        self._reference = token_stream(prompt, seed)
        self._divergence = divergence
        self._noise = token_stream(f"{model}|{prompt}", seed) if divergence > 0 else None

    def next_token(self) -> str:
        token = next_token_text(self._reference)  # always drawn: the reference stays aligned
        if self._noise is not None and self._noise.random() < self._divergence:
            return next_token_text(self._noise)
        return token
