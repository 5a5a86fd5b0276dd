"""Step-time profiles of the sim engine (profiles.yaml): a calibrated linear model per model x GPU."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

PROFILES_PATH = Path(__file__).with_name("profiles.yaml")
DEFAULT_PROFILE = "llama-3.1-8b-h100"


@dataclass(frozen=True)
class SimProfile:
    name: str
    model: str
    gpu: str
    step_base_us: float
    prefill_us_per_token: float
    decode_us_per_seq: float
    kv_blocks_total: int
    kv_block_size: int = 16
    tensor_parallel_size: int = 1
    vllm_version: str = ""
    source: str = ""

    def step_us(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Duration of a step computing `prefill_tokens` uncached prompt tokens and `decode_seqs` decodes."""
        return self.step_base_us + self.prefill_us_per_token * prefill_tokens + self.decode_us_per_seq * decode_seqs


@cache
def load_profiles(path: Path = PROFILES_PATH) -> dict[str, SimProfile]:
    raw = yaml.safe_load(path.read_text())["profiles"]
    return {name: SimProfile(name=name, **fields) for name, fields in raw.items()}


def get_profile(name: str, path: Path = PROFILES_PATH) -> SimProfile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise KeyError(f"unknown sim profile {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]
