#!/usr/bin/env bash
# `make gpu-check` on a host with an NVIDIA GPU: everything the check needs, then the check (bench/gpu_check.py).
# 1. A GPU? `nvidia-smi -L` lists one, else this says so and exits 2 before installing anything (on a machine
#    without a GPU the venv keeps its CPU build of vLLM).
# 2. scripts/setup.sh with LLMBUS_VLLM=gpu: the venv with vLLM's GPU build at the tested release
#    (requirements/vllm-gpu.txt) instead of the CPU build, Java and Redis; idempotent (quick once done).
# 3. python -m bench.gpu_check "$@": starts Kafka and Redis if they do not answer, runs every step within its
#    time limit (540 s in all) and writes bench/reports/gpu_check.md. `--plan` lists the steps.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  echo "gpu-check: no NVIDIA GPU on this machine (nvidia-smi lists none, or there is no driver): nothing installed," \
    "checked or written. Run it on a GPU host; see services/engine_worker/README.md." >&2
  exit 2
fi
LLMBUS_VLLM=gpu scripts/setup.sh
VENV=${LLMBUS_VENV:-$HOME/.cache/llmbus/venv}
PYTHONPATH="$PWD/libs/common:$PWD:$PWD/scripts/pythonpath${PYTHONPATH:+:$PYTHONPATH}" exec "$VENV/bin/python" -m bench.gpu_check "$@"
