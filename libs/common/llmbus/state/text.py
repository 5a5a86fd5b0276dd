"""A Redis reply as text: clients made without decode_responses (ours, llmbus.state.store) return bytes."""

from __future__ import annotations


def text_of(raw: object) -> str:
    """`raw` decoded when bytes (UTF-8), else its str() (a number, or text a decoding client gave)."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)
