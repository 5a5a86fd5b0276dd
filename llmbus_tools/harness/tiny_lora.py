"""Tiny random-weight LoRA adapters for the tiny Llama (tiny_llama.py), made with `peft` (no weights download).

Both LoRA matrices are random (peft's `init_lora_weights=False`; by default B starts at zero and the adapter
changes nothing), so each adapter's greedy answer differs from the base model's and from the other adapters'.
"""

from __future__ import annotations

from pathlib import Path

TARGET_MODULES = ("q_proj", "v_proj")


def build_tiny_lora(base_model_dir: Path, target: Path, seed: int, rank: int = 8) -> Path:
    """An adapter of rank `rank` over the tiny Llama in `target` (adapter_config.json, adapter_model.safetensors)."""
    # Imported here: torch, transformers and peft are heavy and only needed while building.
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(TARGET_MODULES), init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(str(target))
    return target
