"""Pick the weight format (precision / quantisation) of a model that the engine's GPUs can run and hold.

An engine spreads a model over `gpus` GPUs (tensor_parallel_size x pipeline_parallel_size): each holds
1/gpus of the weights and 1/gpus of the KV cache. The rule, in order:
1. Hardware: a format runs only at or above its minimum compute capability, on every GPU of the group
   (the lowest one counts): the larger of the spec's own `min_compute_capability` and the kernel floor
   below (fp8 needs 8.9, Ada / Hopper; bf16 needs 8.0, Ampere; AWQ 7.5; GPTQ 6.0; fp16 7.0, vLLM's floor).
2. Memory: each GPU's share, weight_bytes / gpus plus its share of one max_model_len sequence's KV cache
   (kv_cache_bytes / gpus, where the model's KV size per token is known), must fit in `free VRAM x headroom`
   of the GPU with the least free memory (0.85 by default: the rest is left for the CUDA context,
   activations and the rest of the KV cache).
3. Quality: of what passes 1 and 2, the highest-quality format wins: bf16 > fp16 > fp8 > awq > gptq.
   bf16 and fp16 are both full quality; bf16 comes first because it does not overflow.
Nothing passing raises NoFormatFits naming, per format, what it needed and what there was.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmbus.contract.messages.fleet import ModelFormat

DEFAULT_HEADROOM = 0.85

# Best first. Formats not listed here are never chosen (their kernels are unknown to us).
QUALITY_ORDER: tuple[str, ...] = ("bf16", "fp16", "fp8", "awq", "gptq")

MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "bf16": (8, 0),
    "fp16": (7, 0),
    "fp8": (8, 9),
    "awq": (7, 5),
    "gptq": (6, 0),
}


class NoFormatFits(ValueError):
    """No format of the model runs on this GPU within its usable memory."""


@dataclass(frozen=True)
class FormatChoice:
    format: ModelFormat
    usable_bytes: int  # per GPU
    reason: str


def parse_compute_capability(text: str) -> tuple[int, int]:
    major, _, minor = text.strip().partition(".")
    return int(major), int(minor or 0)


def _cc_text(cc: tuple[int, int]) -> str:
    return f"{cc[0]}.{cc[1]}"


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def required_compute_capability(fmt: ModelFormat) -> tuple[int, int]:
    floor = MIN_COMPUTE_CAPABILITY.get(fmt.name.lower(), (0, 0))
    if fmt.min_compute_capability:
        return max(floor, parse_compute_capability(fmt.min_compute_capability))
    return floor


def supported_formats(compute_capability: str) -> list[str]:
    """The format names this GPU's kernels can run, best first (for WorkerStatus.formats_supported)."""
    cc = parse_compute_capability(compute_capability)
    return [name for name in QUALITY_ORDER if cc >= MIN_COMPUTE_CAPABILITY[name]]


def _per_gpu_need(weight_bytes: int, kv_cache_bytes: int, gpus: int) -> tuple[int, str]:
    """Bytes one GPU of the group holds, and how that was reckoned."""
    need = -(-(weight_bytes + kv_cache_bytes) // gpus)
    what = f"{_gb(weight_bytes)} of weights" + (f" + {_gb(kv_cache_bytes)} of KV cache" if kv_cache_bytes else "")
    return need, (what if gpus == 1 else f"{_gb(need)} per GPU ({what} over {gpus} GPUs)")


def choose_format(
    formats: Iterable[ModelFormat],
    compute_capability: str,
    free_vram_bytes: int,
    headroom: float = DEFAULT_HEADROOM,
    *,
    gpus: int = 1,
    kv_cache_bytes: int = 0,
) -> FormatChoice:
    """The best format for a group of `gpus` GPUs whose lowest compute capability and least free memory are
    given; `kv_cache_bytes`: one max_model_len sequence's KV cache, the whole of it (0: unknown)."""
    if gpus < 1:
        raise ValueError(f"gpus must be at least 1, not {gpus}")
    cc = parse_compute_capability(compute_capability)
    usable = int(free_vram_bytes * headroom)
    least = " (the least free of the group)" if gpus > 1 else ""
    have = f"{_gb(usable)} usable = {headroom:g} x {_gb(free_vram_bytes)} free{least}"
    rejected: list[str] = []
    candidates: list[tuple[int, ModelFormat, str]] = []
    for fmt in formats:
        name = fmt.name.lower()
        if name not in QUALITY_ORDER:
            rejected.append(f"{fmt.name}: unknown format")
            continue
        need_cc = required_compute_capability(fmt)
        if cc < need_cc:
            rejected.append(f"{fmt.name}: needs compute capability {_cc_text(need_cc)}, GPU has {_cc_text(cc)}")
            continue
        need, what = _per_gpu_need(fmt.weight_bytes, kv_cache_bytes, gpus)
        if need > usable:
            rejected.append(f"{fmt.name}: needs {what}, {have}")
            continue
        candidates.append((QUALITY_ORDER.index(name), fmt, what))
    if not candidates:
        detail = "; ".join(rejected) or "the model lists no formats"
        group = f"{gpus} GPUs, " if gpus > 1 else ""
        raise NoFormatFits(f"no format fits this GPU ({group}compute capability {_cc_text(cc)}, {have}): {detail}")
    _, best, what = min(candidates, key=lambda c: (c[0], c[1].weight_bytes))
    reason = f"{best.name}: {what} in {have}, compute capability {_cc_text(cc)}"
    if rejected:
        reason += f" (not: {'; '.join(rejected)})"
    return FormatChoice(format=best, usable_bytes=usable, reason=reason)
