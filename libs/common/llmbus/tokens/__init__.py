"""Token counts and prefix block hashes, the same in router, scheduler and engines.

`count_tokens(text, tokenizer)` counts with the model's tokenizer when its reference loads here
(tokenizer.py), else with the per-script estimate (estimate.py); prefix block hashes are in
blocks.py.
"""

from __future__ import annotations

from llmbus.tokens.blocks import CHARS_PER_TOKEN, DEFAULT_BLOCK_TOKENS, cache_scope, prefix_block_hashes, pseudo_tokens
from llmbus.tokens.estimate import estimate_tokens
from llmbus.tokens.tokenizer import TextTokenizer, TokenizerUnavailable, load_tokenizer, try_load

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_BLOCK_TOKENS",
    "TextTokenizer",
    "TokenizerUnavailable",
    "cache_scope",
    "count_tokens",
    "estimate_tokens",
    "load_tokenizer",
    "prefix_block_hashes",
    "pseudo_tokens",
    "try_load",
]


def count_tokens(text: str, tokenizer: str | None = None) -> int:
    loaded = try_load(tokenizer)
    return loaded.count(text) if loaded is not None else estimate_tokens(text)
