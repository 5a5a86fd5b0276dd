"""Step-time profiles of the sim engine (policies/sim_profiles.yaml): a calibrated linear model per model x GPU."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from llmbus.contract.config_file import read_yaml

PROFILES_PATH = Path(__file__).resolve().parents[3] / "policies" / "sim_profiles.yaml"
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
    # Bytes of one KV block (all layers, K and V) and the host link's bandwidth, for loading
    # blocks back from a host-memory tier (SimCore's host_kv_blocks); 0 = no such tier.
    kv_block_bytes: int = 0
    host_link_gb_per_s: float = 0.0
    tensor_parallel_size: int = 1
    vllm_version: str = ""
    source: str = ""

    def step_us(self, prefill_tokens: int, decode_seqs: int) -> float:
        """Duration of a step computing `prefill_tokens` uncached prompt tokens and `decode_seqs` decodes."""
        return self.step_base_us + self.prefill_us_per_token * prefill_tokens + self.decode_us_per_seq * decode_seqs

    @property
    def host_load_us_per_block(self) -> float:
        """Time to copy one KV block from host memory to the GPU over the host link."""
        if self.kv_block_bytes <= 0 or self.host_link_gb_per_s <= 0:
            raise ValueError(f"profile {self.name!r} has no kv_block_bytes / host_link_gb_per_s for a host KV tier")
        return self.kv_block_bytes / (self.host_link_gb_per_s * 1e3)

    def host_kv_blocks(self, gib: float) -> int:
        """Blocks a host KV buffer of `gib` GiB holds (vLLM's --kv-offloading-size)."""
        return int(gib * (1 << 30)) // self.kv_block_bytes if gib > 0 and self.kv_block_bytes > 0 else 0


@cache
def load_profiles(path: Path = PROFILES_PATH) -> dict[str, SimProfile]:
    raw = read_yaml(path)["profiles"]
    return {name: SimProfile(name=name, **fields) for name, fields in raw.items()}


def get_profile(name: str, path: Path = PROFILES_PATH) -> SimProfile:
    profiles = load_profiles(path)
    if name not in profiles:
        raise KeyError(f"unknown sim profile {name!r}; known: {', '.join(sorted(profiles))}")
    return profiles[name]
