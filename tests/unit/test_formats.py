"""Choosing a model's weight format from the GPU's compute capability and free VRAM."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbus.contract.messages.fleet import ModelFormat
from llmbus_services.engine_worker.core.formats import (
    MIN_COMPUTE_CAPABILITY,
    QUALITY_ORDER,
    NoFormatFits,
    choose_format,
    required_compute_capability,
    supported_formats,
)

GB = 10**9
LLAMA_8B = [
    ModelFormat(name="bf16", weight_bytes=16 * GB),
    ModelFormat(name="fp16", weight_bytes=16 * GB),
    ModelFormat(name="fp8", weight_bytes=8 * GB),
    ModelFormat(name="awq", weight_bytes=5 * GB),
    ModelFormat(name="gptq", weight_bytes=5 * GB),
]


@pytest.mark.parametrize(
    ("cc", "free_gb", "expected"),
    [
        ("9.0", 80, "bf16"),  # H100: everything fits, full quality
        ("8.9", 14, "fp8"),  # L4-ish with 14 GB free: 16 GB does not fit in 11.9, fp8 does
        ("8.0", 14, "awq"),  # A100 slice: no fp8 kernels below 8.9
        ("7.5", 40, "fp16"),  # T4-class: no bf16
        ("7.5", 12, "awq"),
        ("8.0", 18.9, "bf16"),  # 18.9 x 0.85 = 16.07 ≥ 16
        ("8.0", 18.8, "awq"),  # 18.8 x 0.85 = 15.98 < 16, and no fp8 at 8.0
    ],
)
def test_best_quality_that_fits(cc: str, free_gb: float, expected: str) -> None:
    assert choose_format(LLAMA_8B, cc, int(free_gb * GB)).format.name == expected


def test_spec_minimum_raises_the_kernel_floor() -> None:
    fmts = [ModelFormat(name="awq", weight_bytes=GB, min_compute_capability="8.6")]
    assert required_compute_capability(fmts[0]) == (8, 6)
    with pytest.raises(NoFormatFits, match=r"awq: needs compute capability 8\.6, GPU has 8\.0"):
        choose_format(fmts, "8.0", 80 * GB)


def test_nothing_fits_names_what_was_needed_and_what_was_free() -> None:
    with pytest.raises(NoFormatFits) as info:
        choose_format(LLAMA_8B, "8.0", 4 * GB)
    msg = str(info.value)
    assert "3.40 GB usable = 0.85 x 4.00 GB free" in msg
    assert "bf16: needs 16.00 GB of weights" in msg and "awq: needs 5.00 GB of weights" in msg
    assert "fp8: needs compute capability 8.9, GPU has 8.0" in msg


def test_unknown_and_empty() -> None:
    with pytest.raises(NoFormatFits, match="lists no formats"):
        choose_format([], "9.0", 80 * GB)
    with pytest.raises(NoFormatFits, match="int3: unknown format"):
        choose_format([ModelFormat(name="int3", weight_bytes=1)], "9.0", 80 * GB)


def test_supported_formats() -> None:
    assert supported_formats("9.0") == ["bf16", "fp16", "fp8", "awq", "gptq"]
    assert supported_formats("8.0") == ["bf16", "fp16", "awq", "gptq"]
    assert supported_formats("7.0") == ["fp16", "gptq"]


@given(
    sizes=st.lists(st.tuples(st.sampled_from(QUALITY_ORDER), st.integers(0, 200 * GB)), min_size=1, max_size=6),
    cc=st.sampled_from(["6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"]),
    free=st.integers(0, 200 * GB),
)
def test_choice_fits_and_nothing_better_fits(sizes: list[tuple[str, int]], cc: str, free: int) -> None:
    fmts = [ModelFormat(name=n, weight_bytes=b) for n, b in sizes]
    major, minor = (int(x) for x in cc.split("."))
    runnable = [
        f for f in fmts if (major, minor) >= MIN_COMPUTE_CAPABILITY[f.name] and f.weight_bytes <= int(free * 0.85)
    ]
    if not runnable:
        with pytest.raises(NoFormatFits):
            choose_format(fmts, cc, free)
        return
    chosen = choose_format(fmts, cc, free).format
    assert chosen in runnable
    assert QUALITY_ORDER.index(chosen.name) == min(QUALITY_ORDER.index(f.name) for f in runnable)


@given(
    sizes=st.lists(st.tuples(st.sampled_from(QUALITY_ORDER), st.integers(0, 400 * GB)), min_size=1, max_size=6),
    gpus=st.integers(1, 8),
    kv=st.integers(0, 20 * GB),
    free=st.integers(0, 100 * GB),
)
def test_a_group_holds_one_share_of_weights_and_kv_per_gpu(
    sizes: list[tuple[str, int]], gpus: int, kv: int, free: int
) -> None:
    fmts = [ModelFormat(name=n, weight_bytes=b) for n, b in sizes]
    fits = [f for f in fmts if -(-(f.weight_bytes + kv) // gpus) <= int(free * 0.85)]
    if not fits:
        with pytest.raises(NoFormatFits):
            choose_format(fmts, "9.0", free, gpus=gpus, kv_cache_bytes=kv)
        return
    chosen = choose_format(fmts, "9.0", free, gpus=gpus, kv_cache_bytes=kv).format
    assert chosen in fits
    assert QUALITY_ORDER.index(chosen.name) == min(QUALITY_ORDER.index(f.name) for f in fits)


def test_the_reason_says_the_share_per_gpu() -> None:
    choice = choose_format(LLAMA_8B[:1], "9.0", 11 * GB, gpus=2, kv_cache_bytes=2 * GB)
    assert choice.reason.startswith("bf16: 9.00 GB per GPU (16.00 GB of weights + 2.00 GB of KV cache over 2 GPUs)")
    with pytest.raises(NoFormatFits, match=r"2 GPUs, .*the least free of the group"):
        choose_format(LLAMA_8B[:1], "9.0", 11 * GB, gpus=2, kv_cache_bytes=4 * GB)
