"""Prefix block hashes, the same in router, scheduler and sim engine.

Without the model's tokenizer, text is cut into pseudo-tokens of CHARS_PER_TOKEN
characters. Prefix blocks are `block_tokens` pseudo-tokens long and hashed in a chain,
like vLLM's prefix cache: a block's hash covers every block before it, so equal hashes
mean equal prefixes. Only equality matters here, not the count (see estimate.py for that).
"""

from __future__ import annotations

import hashlib

CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_TOKENS = 16


def pseudo_tokens(text: str) -> int:
    """Pseudo-tokens of CHARS_PER_TOKEN characters: the unit the block hashes cut text in."""
    return -(-len(text) // CHARS_PER_TOKEN)


def prefix_block_hashes(
    text: str, block_tokens: int = DEFAULT_BLOCK_TOKENS, max_blocks: int | None = None
) -> list[str]:
    """Chained hashes of the full blocks of `text` (a trailing partial block is not hashed)."""
    block_chars = block_tokens * CHARS_PER_TOKEN
    n_blocks = len(text) // block_chars
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    hashes: list[str] = []
    parent = b""
    for i in range(n_blocks):
        digest = hashlib.blake2b(parent + text[i * block_chars : (i + 1) * block_chars].encode(), digest_size=8)
        parent = digest.digest()
        hashes.append(digest.hexdigest())
    return hashes
