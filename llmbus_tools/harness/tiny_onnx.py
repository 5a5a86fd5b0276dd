"""The tiny Llama (tiny_llama.py) exported to ONNX for the `onnx` engine: onnxruntime-genai's model builder.

The builder reads the Hugging Face checkpoint and writes model.onnx (+ .data), genai_config.json and the
tokenizer files: the graph with GroupQueryAttention and the KV cache inputs and outputs that
onnxruntime-genai's generator drives. float32 on the CPU execution provider, as the engine runs it.
It runs as its own process: it imports torch and transformers, which the caller may not need.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXPORT_TIMEOUT_S = 600  # ~18 s on an idle 2-core machine; much more when the machine is busy


def export_tiny_onnx(model_dir: Path, target: Path, precision: str = "fp32") -> Path:
    """`model_dir` (a Hugging Face Llama checkpoint) exported to `target` for onnxruntime-genai on CPU."""
    command = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "--input", str(model_dir),
        "--output", str(target),
        "--precision", precision,
        "--execution_provider", "cpu",
        "--cache_dir", str(target.parent / f"{target.name}.cache"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S, check=False)
    if done.returncode != 0 or not (target / "genai_config.json").is_file():
        raise RuntimeError(f"ONNX export of {model_dir} failed ({done.returncode}): {done.stderr[-4000:]}")
    return target
