"""Token counts: the per-script estimate within 15 % of a real tokenizer on the mixed corpus, and
tokenizers loaded from local references only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmbus.tokens import TokenizerUnavailable, count_tokens, estimate_tokens, load_tokenizer, try_load

CORPUS = Path(__file__).resolve().parents[2] / "data" / "tokens" / "corpus.jsonl"
TEKKEN = "pkg:mistral_common/data/tekken_240911.json"  # Mistral NeMo's, shipped in mistral-common's wheel
BOUND = 0.15


def _by_script(estimate) -> dict[str, float]:  # type: ignore[no-untyped-def]
    tekken = load_tokenizer(TEKKEN)
    sums: dict[str, list[int]] = {}
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        for key in (sample["script"], "all"):
            got = sums.setdefault(key, [0, 0])
            got[0] += estimate(sample["text"])
            got[1] += tekken.count(sample["text"])
    return {script: (est - real) / real for script, (est, real) in sums.items()}


def test_estimate_is_within_15_percent_of_tekken_for_every_script_of_the_corpus() -> None:
    errors = _by_script(estimate_tokens)
    assert {"latin", "cjk", "cyrillic", "code", "mixed", "all"} <= set(errors)
    assert all(abs(e) <= BOUND for e in errors.values()), errors


def test_four_characters_per_token_misses_the_bound_on_cjk_and_code() -> None:
    """The check above can fail: the old estimate under-counts CJK and code far past it."""
    errors = _by_script(lambda text: math.ceil(len(text) / 4))
    assert errors["cjk"] < -0.5 and errors["code"] < -BOUND


def test_package_reference_counts_with_the_real_tokenizer() -> None:
    text = "消息队列把每个分区中的记录按照写入的顺序保存下来"
    assert count_tokens(text, TEKKEN) == load_tokenizer(TEKKEN).count(text) > len(text) / 2


def test_hf_tokenizer_json_directory_is_read(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(["hello world"] * 20, trainers.BpeTrainer(vocab_size=60, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    assert load_tokenizer(str(tmp_path)).count("hello world hello") == 3


@pytest.mark.parametrize("ref", ["pkg:no_such_package/x.json", "/nonexistent/tokenizer.json", "mistralai/Mistral-7B"])
def test_a_reference_not_on_this_machine_is_unavailable_and_the_estimate_counts(ref: str) -> None:
    with pytest.raises(TokenizerUnavailable):
        load_tokenizer(ref)
    assert try_load(ref) is None
    assert count_tokens("four words of text", ref) == estimate_tokens("four words of text")
