"""Sentence embedders the semantic cache may use, by registry name. Nothing is downloaded at run time.

wordllama: WordLlama's l2_supercat model (256-d static token embeddings, MIT), whose weights and
tokenizer ship inside the `wordllama` wheel; loaded from the package directory with downloads off
(its default lookup path misses the packaged tokenizer and would try Hugging Face).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llmbus.contract.plugins import Registry
from llmbus_services.router.core.semantic import Embedder, normalised

EMBEDDERS: Registry[Embedder] = Registry("embedder")


@EMBEDDERS.register("wordllama")
class WordLlamaEmbedder:
    name = "wordllama"

    def __init__(self) -> None:
        import wordllama
        from wordllama import WordLlama

        self._model = WordLlama.load(cache_dir=Path(wordllama.__file__).parent, disable_download=True)

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return normalised(np.asarray(self._model.embed(list(texts)), dtype=np.float32))


def build_embedder(name: str) -> Embedder:
    return EMBEDDERS.build(name)
