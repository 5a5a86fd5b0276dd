#!/usr/bin/env bash
# A Docker engine for the compose stack: uses the one that answers, or (root only) starts Debian's
# dockerd with no bridge and no firewall changes, so it can run on hosts where Docker must not touch
# the network (every container of the stack uses the host's network, on loopback).
# Usage: deploy/compose/engine.sh start|stop|status   (idempotent; stop only stops a dockerd it started)
set -euo pipefail

CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
RUN_DIR=$CACHE/run
PID_FILE=$RUN_DIR/dockerd.pid
LOG_FILE=$RUN_DIR/dockerd.log
READY_TIMEOUT_S=${DOCKERD_READY_TIMEOUT_S:-60}

log() { echo "[engine] $*" >&2; }

answering() { timeout 10 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

# The pid file's dockerd, if it is still one (a pid file left by a dead one may name a reused pid).
started_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && case "$(cat "/proc/$pid/comm" 2>/dev/null)" in dockerd | setsid) echo "$pid" ;; *) return 1 ;; esac
}

install() {
  command -v dockerd >/dev/null && return
  log "installing Debian's docker.io"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq docker.io >/dev/null
}

start() {
  if answering; then log "a Docker engine answers ($(docker version --format '{{.Server.Version}}'))"; return; fi
  if [ "$(id -u)" != 0 ]; then log "no Docker engine answers and only root may start one here"; exit 3; fi
  install
  mkdir -p "$RUN_DIR"
  log "starting dockerd without bridge or firewall rules (logs: $LOG_FILE)"
  setsid dockerd --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false --bridge=none \
    --storage-driver=overlay2 --pidfile "$RUN_DIR/dockerd.own.pid" >"$LOG_FILE" 2>&1 </dev/null &
  echo $! >"$PID_FILE"
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    if answering; then log "ready"; return; fi
    if ! started_pid >/dev/null; then log "dockerd exited"; tail -20 "$LOG_FILE" >&2; exit 1; fi
    sleep 0.3
  done
  log "not ready after ${READY_TIMEOUT_S}s; see $LOG_FILE"; exit 1
}

stop() {
  local pid
  if ! pid=$(started_pid); then log "no dockerd started by this script"; rm -f "$PID_FILE"; return; fi
  log "stopping dockerd (pid $pid)"
  kill -TERM "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
  kill -0 "$pid" 2>/dev/null && { log "still alive after 30 s; killing"; kill -KILL "$pid"; }
  rm -f "$PID_FILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if answering; then echo running; else echo stopped; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
