"""Fill-in-the-middle: a completion's prefix and suffix rendered in the model's FIM format.

A code model is trained on one arrangement of its sentinel tokens around the two halves; sent
anything else it completes the prefix as plain text. The worker setting names a known format or
gives a template with `{prefix}` and `{suffix}`. The known formats, as their publishers give them:

- `qwen2.5-coder`: QwenLM/Qwen2.5-Coder README ("file-level code completion", fill-in-the-middle);
  the tokens are in every Qwen2.5 tokenizer.
- `starcoder2`: bigcode's StarCoder / StarCoder2 (`<fim_prefix>` ... without bars; the StarCoder2
  paper, arXiv 2402.19173, section 5).
- `codellama`: Code Llama's infilling prompt, `<PRE> {prefix} <SUF>{suffix} <MID>` (the Hugging Face
  Code Llama model docs; Meta's codellama `generation.py` builds the same ids).
- `codestral`: Mistral's tokenizers v2 and v3 (mistral-common, `encode_fim`): suffix first,
  `[SUFFIX]{suffix}[PREFIX]{prefix}` after BOS (mistralai/cookbook, tokenization/chat_templates.md).

BOS is left to the tokenizer (it adds its own to every prompt, as vLLM does for a completion).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

FIM_FORMATS: dict[str, str] = {
    "qwen2.5-coder": "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
    "starcoder2": "<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
    "codellama": "<PRE> {prefix} <SUF>{suffix} <MID>",
    "codestral": "[SUFFIX]{suffix}[PREFIX]{prefix}",
}

_FIELD = re.compile(r"\{(\w*)\}")
# A sentinel: <...> or [...] (every format above), else a run of other text between them.
_SENTINEL = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]|[^\s<\[]+")


@dataclass(frozen=True)
class FimTemplate:
    """A FIM format split at its two fields: text (sentinels) around `{prefix}` and `{suffix}`."""

    pieces: tuple[str, str, str]  # before the first field, between the two, after the second
    prefix_first: bool

    def render(self, prefix: str, suffix: str) -> str:
        # Concatenated, never str.format: a prefix holding "{suffix}" (code often does) stays text.
        first, second = (prefix, suffix) if self.prefix_first else (suffix, prefix)
        return f"{self.pieces[0]}{first}{self.pieces[1]}{second}{self.pieces[2]}"

    def sentinels(self) -> list[str]:
        """The template's marker texts (whitespace around them dropped), which the tokenizer must know."""
        return [m.group(0) for piece in self.pieces for m in _SENTINEL.finditer(piece)]


def parse_fim_template(setting: str) -> FimTemplate:
    """A known format's name, or a template with `{prefix}` and `{suffix}` once each (ValueError else)."""
    template = FIM_FORMATS.get(setting, setting)
    fields = [m.group(1) for m in _FIELD.finditer(template)]
    if sorted(fields) != ["prefix", "suffix"]:
        known = ", ".join(sorted(FIM_FORMATS))
        raise ValueError(
            f"FIM format {setting!r}: name one of {known}, or give a template with {{prefix}} and {{suffix}} once each"
            f" and no other {{field}} (found {fields})"
        )
    before, first, rest = _split_at_field(template)
    between, _, after = _split_at_field(rest)
    if not (before + between + after).strip():
        raise ValueError(f"FIM format {setting!r} has no sentinel tokens around {{prefix}} and {{suffix}}")
    return FimTemplate((before, between, after), prefix_first=first == "prefix")


def _split_at_field(text: str) -> tuple[str, str, str]:
    match = _FIELD.search(text)
    assert match is not None
    return text[: match.start()], match.group(1), text[match.end() :]


def unknown_sentinels(template: FimTemplate, known_tokens: Iterable[str]) -> list[str]:
    """The template's sentinels that are not single tokens of the model's vocabulary.

    `known_tokens` are the tokenizer's token strings; SentencePiece writes a leading space as "▁"
    (Code Llama's `▁<PRE>`), which counts as the same token here."""
    known = {t.removeprefix("▁") for t in known_tokens}
    return [s for s in template.sentinels() if s not in known]
