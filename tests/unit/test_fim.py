"""Fill-in-the-middle rendering (services/engine_worker/core/fim.py) and its worker setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llmbus_services.engine_worker.config import WorkerSettings
from llmbus_services.engine_worker.core.fim import FIM_FORMATS, parse_fim_template, unknown_sentinels

PREFIX = "def area(r):\n    "
SUFFIX = "\n    return a\n"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen2.5-coder", f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>"),
        ("starcoder2", f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"),
        ("codellama", f"<PRE> {PREFIX} <SUF>{SUFFIX} <MID>"),
        ("codestral", f"[SUFFIX]{SUFFIX}[PREFIX]{PREFIX}"),  # suffix first (mistral-common's encode_fim)
    ],
)
def test_each_known_format_renders_as_its_model_was_trained(name: str, expected: str) -> None:
    assert parse_fim_template(name).render(PREFIX, SUFFIX) == expected


def test_a_prefix_or_suffix_holding_braces_stays_text() -> None:
    template = parse_fim_template("qwen2.5-coder")
    code = 'f"{prefix}{suffix}" + "{}"'
    assert template.render(code, code) == f"<|fim_prefix|>{code}<|fim_suffix|>{code}<|fim_middle|>"


def test_a_custom_template_is_taken_in_either_order() -> None:
    spm = parse_fim_template("<s><fim_suffix>{suffix}<fim_prefix>{prefix}<fim_middle>")
    assert spm.render("P", "S") == "<s><fim_suffix>S<fim_prefix>P<fim_middle>"
    assert spm.sentinels() == ["<s>", "<fim_suffix>", "<fim_prefix>", "<fim_middle>"]


@pytest.mark.parametrize(
    "bad",
    [
        "qwen",  # not a known name, no fields
        "<PRE>{prefix}<MID>",  # no suffix
        "<a>{prefix}<b>{suffix}<c>{prefix}",  # prefix twice
        "<a>{prefix}<b>{suffix}<c>{middle}",  # an unknown field
        "{prefix}{suffix}",  # no sentinels: a plain completion of prefix + suffix
    ],
)
def test_a_template_that_is_not_fim_is_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_fim_template(bad)


def test_the_worker_setting_is_validated_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLMBUS_WORKER_VLLM_FIM_FORMAT", "codestral")
    assert WorkerSettings().vllm_fim_format == "codestral"
    monkeypatch.setenv("LLMBUS_WORKER_VLLM_FIM_FORMAT", "<PRE>{prefix}")
    with pytest.raises(ValidationError, match="prefix"):
        WorkerSettings()


def test_sentinels_must_be_tokens_of_the_model() -> None:
    qwen = parse_fim_template("qwen2.5-coder")
    assert unknown_sentinels(qwen, ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "a"]) == []
    assert unknown_sentinels(qwen, ["<|fim_prefix|>", "a"]) == ["<|fim_suffix|>", "<|fim_middle|>"]
    # SentencePiece's space marker: Code Llama's tokenizer holds "▁<PRE>", "▁<SUF>", "▁<MID>".
    assert unknown_sentinels(parse_fim_template("codellama"), ["▁<PRE>", "▁<SUF>", "▁<MID>"]) == []
    assert set(FIM_FORMATS) == {"qwen2.5-coder", "starcoder2", "codellama", "codestral"}
