"""The compose smoke's model release: two versions of a model pushed into the stack's object store and
registered, a sim worker per version that fetches and verifies its artifact, the first version served and
the second released through shadow to 100 % on users' requests through the gateway, with its upgrade id
in `llmbus trace` and its outcome in `llmbus models history` (stack.py smoke, one timed step each)."""

from __future__ import annotations

import contextlib
import json
import shlex
import threading
from typing import Any

import yaml
from project import Stack
from steps import StepFailed, run, say, step, wait_for

MODEL = "smoke-model"
BUCKET = "llmbus-models"
# Port suffixes of the versions' workers' /metrics (listed in project.PORT_SUFFIXES).
WORKER_PORTS = {"1": "9131", "2": "9132"}
# A release the smoke can finish: shadow, then everyone, on a handful of samples each (the comparator
# decides every 10 s); the sims of both versions answer alike, and the shared machine's latency is noisy.
RELEASE_PLAN = {
    "shadow_share": 1.0,
    "ramp": {"steps_pct": [0, 100], "min_samples_per_step": 5, "min_step_s": 0},
    "guardrails": {"min_samples": 5, "max_p95_regression": 3.0},
}


def manifest(version: str, parent: str | None) -> dict[str, Any]:
    """The version's manifest (llmbus.contract.manifest.ModelManifest)."""
    return {
        "name": MODEL,
        "version": version,
        "owner": "compose-smoke",
        "context_length_tokens": 2048,
        "max_output_tokens": 64,
        "hardware": {"cpu_capable": True},
        "lineage": {
            "training_data_version": f"smoke-chats-{version}",
            "training_code_commit": f"smoke{version}",
            "hyperparameters": {"epochs": int(version)},
            "parent_version": parent,
        },
        "release": RELEASE_PLAN,
    }


def push_script(version: str, parent: str | None) -> str:
    """A shell script for the cli container: the version's files (random weights) and manifest, pushed."""
    config = {"architectures": ["LlamaForCausalLM"], "smoke_version": version}
    return "\n".join(
        [
            "set -eu",
            'dir=$(mktemp -d) && mkdir "$dir/files"',
            f"printf '%s' {shlex.quote(json.dumps(config))} > \"$dir/files/config.json\"",
            'head -c 262144 /dev/urandom > "$dir/files/model.safetensors"',
            f"printf '%s' {shlex.quote(yaml.safe_dump(manifest(version, parent)))} > \"$dir/manifest.yaml\"",
            f'llmbus models push "$dir/files" --manifest "$dir/manifest.yaml" --to s3://{BUCKET}/ --format fp32',
        ]
    )


def upgrade_id_of(released: str) -> str:
    """`release upg-…: smoke-model@2 is shadow` → the upgrade id."""
    for line in released.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == "release" and words[1].startswith("upg-"):
            return words[1].rstrip(":")
    raise StepFailed(f"no upgrade id in what `llmbus models release` said:\n{released}")


def worker_name(stack: Stack, version: str) -> str:
    return f"{stack.project}-{MODEL}-v{version}"


def start_worker(stack: Stack, version: str) -> None:
    stack(
        "run", "-d", "--no-deps", "--name", worker_name(stack, version),
        "-e", f"LLMBUS_WORKER_MODEL_REF={MODEL}@{version}",
        "-e", f"LLMBUS_WORKER_WORKER_ID={MODEL}-v{version}",
        "-e", f"LLMBUS_METRICS_PORT={stack.port(WORKER_PORTS[version])}",
        "-e", "LLMBUS_WORKER_SIM_SPEEDUP=0",
        "worker-version",
    )  # fmt: skip


def release_a_model_version(stack: Stack, api_key: str) -> None:
    try:
        _release(stack, api_key)
    finally:
        for version in WORKER_PORTS:
            run(["docker", "rm", "-f", worker_name(stack, version)], check=False)


def _release(stack: Stack, api_key: str) -> None:
    with step(f"{MODEL} versions 1 and 2 pushed into the stack's object store and registered (llmbus models push)"):
        for version, parent in (("1", None), ("2", "1")):
            pushed = stack("run", "--rm", "-T", "cli", "sh", "-c", push_script(version, parent), timeout_s=120)
            if f"registered {MODEL}@{version}" not in pushed:
                raise StepFailed(f"version {version} not registered:\n{pushed}")
        say("    " + "\n    ".join(line for line in pushed.splitlines() if line.strip()))
    with step("a sim worker per version: its artifact fetched from the object store and verified, then ready"):
        for version in WORKER_PORTS:
            start_worker(stack, version)
        for version, suffix in WORKER_PORTS.items():
            wait_for(f"{MODEL}@{version}'s worker ready", lambda suffix=suffix: stack.worker_ready(suffix), 120)
        status = stack.cli("status")
        phases = [line.strip() for line in status.splitlines() if line.strip().startswith(f"{MODEL}-v")]
        if not any("fetch" in line and "verify" in line for line in phases):
            raise StepFailed(f"no fetch and verify phases of the versions' workers in llmbus status:\n{status}")
        say("    " + "\n    ".join(phases))
    with step(f"llmbus models release {MODEL}@1 (serves at once), then {MODEL}@2: an upgrade id, shadow first"):
        first = stack.cli("models", "release", f"{MODEL}@1")
        if "serving (first version)" not in first:
            raise StepFailed(f"version 1 not served:\n{first}")
        upgrade_id = upgrade_id_of(stack.cli("models", "release", f"{MODEL}@2"))
        say(f"    release {upgrade_id}")
    with step(f"users ask {MODEL} through the gateway until the comparator has ramped {MODEL}@2 to 100 %"):
        request_ids = _ask_until_released(stack, api_key)
        say(f"    promoted after {len(request_ids)} requests")
    with step("llmbus trace: a request of the rollout carries its upgrade id; llmbus models history: promoted"):
        traced = stack.cli("trace", request_ids[0], "--since-minutes", "30", "--timeout-s", "60")
        if f"release {upgrade_id}" not in traced:
            raise StepFailed(f"no 'release {upgrade_id}' in the trace of {request_ids[0]}:\n{traced}")
        history = stack.cli("models", "history", MODEL)
        if upgrade_id not in history or "promoted" not in history:
            raise StepFailed(f"release {upgrade_id} not promoted in llmbus models history:\n{history}")
        say("    " + next(line.strip() for line in traced.splitlines() if f"release {upgrade_id}" in line))


def _ask_until_released(stack: Stack, api_key: str, timeout_s: float = 150) -> list[str]:
    """Users' requests (each user its own A/B bucket) while `llmbus models watch` follows the release:
    the request ids sent, once the release is promoted."""
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{stack.port('8000')}/v1", api_key=api_key, timeout=60, max_retries=0)
    done = threading.Event()
    request_ids: list[str] = []
    failed = 0

    def users() -> None:
        nonlocal failed
        while not done.is_set():
            n = len(request_ids) + failed
            answer = None
            with contextlib.suppress(Exception):  # a failed request counts in the guardrails: the watch says
                answer = client.chat.completions.with_raw_response.create(
                    model=MODEL, user=f"user-{n}", max_tokens=8, messages=[{"role": "user", "content": f"q {n}"}]
                )
            if answer is None:
                failed += 1
                done.wait(0.5)
            else:
                request_ids.append(answer.headers["x-request-id"])

    sender = threading.Thread(target=users, daemon=True)
    sender.start()
    try:
        watched = stack("run", "--rm", "-T", "cli", "llmbus", "models", "watch", MODEL, "--timeout-s", str(timeout_s),
                        timeout_s=timeout_s + 60, check=False)  # fmt: skip
    finally:
        done.set()
        sender.join(60)
    if f"{MODEL}@2: promoted" not in watched:
        raise StepFailed(f"the release did not reach 100 % ({failed} requests failed):\n{watched}")
    if not request_ids:
        raise StepFailed("no request answered")
    return request_ids
