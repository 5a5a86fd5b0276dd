"""Does SimCore schedule like vLLM? Drive vLLM's own v1 Scheduler and SimCore side by side.

    python -m bench.sim_vllm_parity      # writes bench/reports/sim_vllm_parity.{json,md,png}

The same requests (prompts as token ids; shared prefixes; arrivals spread over steps) go
to vllm.v1.core.sched.scheduler.Scheduler (no model: each step's "sampled" token is a
deterministic function of the prompt and position, so output blocks hash alike) and to
SimCore with the same limits and KV blocks. Per step we compare which requests got how
many tokens, and price both schedules with the same step-time profile. Needs the vLLM
CPU build (imports in ~6 s) and the tiny Llama config from llmbus_tools.harness (no weights run).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmbus_services.engine_worker.adapters.engines.sim.core import SimCore, SimRequest
from llmbus_services.engine_worker.adapters.engines.sim.profiles import SimProfile, get_profile

REPORTS = Path(__file__).parent / "reports"
COMMAND = "python -m bench.sim_vllm_parity"
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Workload:
    name: str
    requests: list[tuple[str, list[int], int, int]]  # id, prompt token ids, max_tokens, arrival step
    kv_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int = 2048


def make_workload(name: str, seed: int, n: int, kv_blocks: int, max_num_seqs: int, budget: int) -> Workload:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(20, 200))] for _ in range(4)]
    requests = []
    for i in range(n):
        prompt = prefixes[rng.randrange(4)] + [rng.randrange(1000) for _ in range(rng.randint(1, 300))]
        requests.append((f"r{i}", prompt, rng.randint(1, 80), rng.randint(0, n // 2)))
    return Workload(name, requests, kv_blocks, max_num_seqs, budget)


WORKLOADS = [
    make_workload("roomy cache", seed=1, n=40, kv_blocks=2000, max_num_seqs=16, budget=512),
    make_workload("tight cache (preemptions)", seed=2, n=40, kv_blocks=60, max_num_seqs=16, budget=512),
    make_workload("small batches", seed=3, n=60, kv_blocks=120, max_num_seqs=4, budget=128),
]


@dataclass
class ParityResult:
    name: str
    steps: int = 0
    identical_steps: int = 0
    vllm_preemptions: int = 0
    sim_preemptions: int = 0
    vllm_tokens: int = 0
    sim_tokens: int = 0
    vllm_virtual_ms: float = 0.0  # the vLLM schedule priced with the same profile
    sim_virtual_ms: float = 0.0
    first_mismatches: list[dict] = field(default_factory=list)
    per_step: list[tuple[int, int]] = field(default_factory=list)  # (vllm tokens, sim tokens)


def _block_hash(obj: object) -> bytes:
    return hashlib.sha256(pickle.dumps(obj)).digest()


def _chained_hashes(ids: list[int]) -> tuple[str, ...]:
    out, parent = [], ""
    for j in range(len(ids) // BLOCK_SIZE):
        parent = hashlib.blake2b(
            (parent + repr(ids[j * BLOCK_SIZE : (j + 1) * BLOCK_SIZE])).encode(), digest_size=8
        ).hexdigest()
        out.append(parent)
    return tuple(out)


def _sampled_token(key: str, position: int) -> int:
    return int(hashlib.blake2b(f"{key}:{position}".encode(), digest_size=4).hexdigest(), 16) % 1000


def build_vllm_scheduler(w: Workload):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from llmbus_tools.harness.tiny_llama import build_tiny_llama

    scheduler_config = SchedulerConfig(
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        max_model_len=w.max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        async_scheduling=False,  # what the CPU build forces; a GPU host's default would turn it on
    )
    model_config = ModelConfig(model=str(build_tiny_llama()), dtype="float32", seed=0, max_model_len=w.max_model_len)
    cache_config = CacheConfig(block_size=BLOCK_SIZE, cache_dtype="auto", enable_prefix_caching=True)
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config)
    num_blocks = w.kv_blocks + 1  # vLLM keeps one null block out of use
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)]
    )
    cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK_SIZE,
        log_stats=False,
    )


def run_parity(w: Workload, profile: SimProfile) -> ParityResult:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(_block_hash)
    hasher = get_request_block_hasher(BLOCK_SIZE, _block_hash)
    vllm = build_vllm_scheduler(w)
    core = SimCore(
        profile,
        kv_blocks_total=w.kv_blocks,
        max_num_seqs=w.max_num_seqs,
        max_num_batched_tokens=w.max_num_batched_tokens,
        max_model_len=w.max_model_len,
    )
    keys: dict[str, str] = {}
    res = ParityResult(w.name)
    last_arrival = max(a for *_, a in w.requests)
    step = 0
    while step <= last_arrival or core.has_work() or vllm.has_unfinished_requests():
        for rid, prompt, max_tokens, arrival in w.requests:
            if arrival == step:
                keys[rid] = hashlib.blake2b(repr(prompt).encode(), digest_size=8).hexdigest()
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
                vllm.add_request(Request(rid, list(prompt), params, None, block_hasher=hasher))
                core.add(SimRequest(rid, len(prompt), max_tokens, _chained_hashes(prompt), keys[rid]))
        sched = vllm.schedule()
        vllm_tokens = dict(sched.num_scheduled_tokens)
        sim = core.step()
        res.steps += 1
        res.identical_steps += vllm_tokens == sim.num_scheduled_tokens
        if vllm_tokens != sim.num_scheduled_tokens and len(res.first_mismatches) < 3:
            res.first_mismatches.append({"step": step, "vllm": vllm_tokens, "sim": sim.num_scheduled_tokens})
        res.vllm_preemptions += len(getattr(sched, "preempted_req_ids", None) or ())
        res.vllm_tokens += sum(vllm_tokens.values())
        res.sim_tokens += sum(sim.num_scheduled_tokens.values())
        res.per_step.append((sum(vllm_tokens.values()), sum(sim.num_scheduled_tokens.values())))
        # Price vLLM's batch the way SimCore prices its own: decodes are 1-token steps of started requests.
        prefill, decodes = 0, 0
        sampled: list[list[int]] = []
        for rid, n in vllm_tokens.items():
            req = vllm.requests[rid]
            computed_before = req.num_computed_tokens - n
            if req.num_output_tokens > 0 and computed_before == req.num_tokens - 1:
                decodes += 1
            else:
                prefill += n
            done = req.num_computed_tokens >= req.num_tokens
            sampled.append([_sampled_token(keys[rid], req.num_output_tokens)] if done else [])
        res.vllm_virtual_ms += profile.step_us(prefill, decodes) / 1e3
        res.sim_virtual_ms += sim.duration_us / 1e3
        ids = list(vllm_tokens)
        out = ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled
        )
        vllm.update_from_output(sched, out)
        step += 1
        if step > 100_000:
            raise RuntimeError("parity run did not finish")
    res.sim_preemptions = core.preemptions_total
    return res


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = time.perf_counter()
    profile = get_profile("llama-3.1-8b-h100")
    results = []
    for w in WORKLOADS:
        print(f"[sim_vllm_parity] {w.name}: {len(w.requests)} requests", file=sys.stderr, flush=True)
        r = run_parity(w, profile)
        print(
            f"[sim_vllm_parity]   identical steps {r.identical_steps}/{r.steps}, preemptions vLLM "
            f"{r.vllm_preemptions} sim {r.sim_preemptions}",
            file=sys.stderr,
            flush=True,
        )
        results.append(r)
    import vllm

    report: dict[str, Any] = {
        "command": COMMAND,
        "vllm_version": vllm.__version__,
        "profile": profile.name,
        "wall_s": round(time.perf_counter() - t0, 1),
        "workloads": [
            {k: v for k, v in r.__dict__.items() if k != "per_step"}
            | {
                "kv_blocks": w.kv_blocks,
                "max_num_seqs": w.max_num_seqs,
                "max_num_batched_tokens": w.max_num_batched_tokens,
                "requests": len(w.requests),
            }
            for r, w in zip(results, WORKLOADS, strict=True)
        ],
    }
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / "sim_vllm_parity.json").write_text(json.dumps(report, indent=2))
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.8))
    for ax, r in zip(axes, results, strict=True):
        ax.plot([v for v, _ in r.per_step], label="vLLM Scheduler", lw=2.5, alpha=0.6)
        ax.plot([s for _, s in r.per_step], label="SimCore", lw=1)
        ax.set(
            title=f"{r.name}: {r.identical_steps}/{r.steps} steps identical", xlabel="step", ylabel="tokens scheduled"
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(REPORTS / "sim_vllm_parity.png", dpi=100)
    lines = [
        "# SimCore vs vLLM's v1 Scheduler",
        "",
        f"Command (from the repo root): `{COMMAND}` — vLLM {report['vllm_version']} (CPU build), "
        f"took {report['wall_s']} s.",
        "",
        "Same requests, limits and KV blocks on both; a step is identical when every request got the same",
        f"number of tokens. Virtual time prices both schedules with the {profile.name} profile.",
        "",
        "| workload | requests | KV blocks | max seqs | token budget | identical steps "
        "| preemptions vLLM / sim | tokens vLLM / sim | virtual ms vLLM / sim |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wr in report["workloads"]:
        lines.append(
            f"| {wr['name']} | {wr['requests']} | {wr['kv_blocks']} | {wr['max_num_seqs']} "
            f"| {wr['max_num_batched_tokens']} "
            f"| {wr['identical_steps']}/{wr['steps']} | {wr['vllm_preemptions']} / {wr['sim_preemptions']} "
            f"| {wr['vllm_tokens']} / {wr['sim_tokens']} | {wr['vllm_virtual_ms']:.1f} / {wr['sim_virtual_ms']:.1f} |"
        )
    lines += ["", "First differing steps (request → tokens):", ""]
    mismatches = [(wr["name"], m) for wr in report["workloads"] for m in wr["first_mismatches"]]
    for name, m in mismatches:
        lines.append(f"- {name}, step {m['step']}: vLLM {m['vllm']} / sim {m['sim']}")
    if not mismatches:
        lines.append("- none")
    lines += ["", "![per-step tokens](sim_vllm_parity.png)", ""]
    (REPORTS / "sim_vllm_parity.md").write_text("\n".join(lines))
    print(f"[sim_vllm_parity] wrote {REPORTS}/sim_vllm_parity.{{json,md,png}}", file=sys.stderr)


if __name__ == "__main__":
    main()
