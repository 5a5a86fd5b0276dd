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
