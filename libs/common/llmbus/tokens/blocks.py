"""Prefix block hashes, the same in router, scheduler and sim engine.

Without the model's tokenizer, text is cut into pseudo-tokens of CHARS_PER_TOKEN
characters. Prefix blocks are `block_tokens` pseudo-tokens long and hashed in a chain,
like vLLM's prefix cache: a block's hash covers every block before it, so equal hashes
mean equal prefixes. Only equality matters here, not the count (see estimate.py for that).
A `salt` starts the chain (as vLLM's `cache_salt` enters its first block's hash): equal prompts under
different salts share no hash. A LoRA `adapter` starts it too (its KV cache is not its base model's, and
vLLM keys its prefix cache by adapter): the chain starts from both, so a tenant's blocks under an adapter
are shared neither with another tenant nor with the base model or another adapter.
"""

from __future__ import annotations

import hashlib

CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_TOKENS = 16


def pseudo_tokens(text: str) -> int:
    """Pseudo-tokens of CHARS_PER_TOKEN characters: the unit the block hashes cut text in."""
    return -(-len(text) // CHARS_PER_TOKEN)


def cache_scope(salt: str = "", adapter: str | None = None) -> str:
    """What a prompt's first block is keyed by besides its tokens: the cache salt, then the adapter ("":
    neither). The NUL between them cannot occur in either (a salt is hex, an adapter name is a model name)."""
    return salt + (f"\0lora:{adapter}" if adapter else "")


def prefix_block_hashes(
    text: str,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    max_blocks: int | None = None,
    salt: str = "",
    adapter: str | None = None,
) -> list[str]:
    """Chained hashes of the full blocks of `text` (a trailing partial block is not hashed), under `salt`
    and `adapter` (cache_scope)."""
    block_chars = block_tokens * CHARS_PER_TOKEN
    n_blocks = len(text) // block_chars
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    hashes: list[str] = []
    parent = cache_scope(salt, adapter).encode()
    for i in range(n_blocks):
        digest = hashlib.blake2b(parent + text[i * block_chars : (i + 1) * block_chars].encode(), digest_size=8)
        parent = digest.digest()
        hashes.append(digest.hexdigest())
    return hashes
