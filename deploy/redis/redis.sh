#!/usr/bin/env bash
# Local Redis for llmbus from Debian's redis-server (installed if missing).
# Usage: deploy/redis/redis.sh start|stop|status   (idempotent)
# A second, private instance (the reliability tests stop and restart one) takes its own port and
# run dir: REDIS_PORT=16379 REDIS_RUN_DIR=/tmp/x redis.sh start
# Persistent by default: API keys, exactly-once markers, the cost outbox and held results live in
# Redis, so every write goes to the append-only file (fsync every second, at most ~1 s of writes lost
# on a crash; none on a stop). REDIS_APPENDONLY=no for a throwaway instance.
# Redis AUTH: REDIS_PASSWORD=... redis.sh start (requirepass; clients set LLMBUS_REDIS_PASSWORD).
# Redis ACL users: REDIS_ACLFILE=<file> (from `llmbus acl redis-users`: one user per service, and
# `default` with REDIS_PASSWORD, which this script's own redis-cli calls use) loads it with `aclfile`.
set -euo pipefail

CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
RUN_DIR=${REDIS_RUN_DIR:-$CACHE/run}
PORT=${REDIS_PORT:-6379}
NAME=${REDIS_NAME:-redis}  # pid, log and data of this instance: $RUN_DIR/$NAME.*, $RUN_DIR/$NAME-data
APPENDONLY=${REDIS_APPENDONLY:-yes}
PASSWORD=${REDIS_PASSWORD:-}
ACLFILE=${REDIS_ACLFILE:-}
# redis-cli reads the password from REDISCLI_AUTH: it stays out of the process list.
if [ -n "$PASSWORD" ]; then export REDISCLI_AUTH=$PASSWORD; fi
PID_FILE=$RUN_DIR/$NAME.pid

log() { echo "[redis] $*" >&2; }

answering() { command -v redis-cli >/dev/null && [ "$(redis-cli -p "$PORT" ping 2>/dev/null)" = "PONG" ]; }

install() {
  command -v redis-server >/dev/null && return
  log "installing Debian's redis-server"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
}

start() {
  if answering; then log "already answering on 127.0.0.1:$PORT"; return; fi
  install
  mkdir -p "$RUN_DIR/$NAME-data"
  local options=(--bind 127.0.0.1 --port "$PORT" --daemonize yes --pidfile "$PID_FILE"
    --dir "$RUN_DIR/$NAME-data" --logfile "$RUN_DIR/$NAME.log" --save "" --appendonly "$APPENDONLY" --appendfsync everysec)
  if [ -n "$ACLFILE" ]; then  # the users and their password hashes are in the file, not on argv
    redis-server "${options[@]}" --aclfile "$(realpath "$ACLFILE")"
  elif [ -n "$PASSWORD" ]; then  # config on stdin, not argv: the password stays out of `ps`
    printf 'requirepass "%s"\n' "$PASSWORD" | redis-server - "${options[@]}"
  else
    redis-server "${options[@]}"
  fi
  for _ in $(seq 1 50); do answering && { log "ready on 127.0.0.1:$PORT"; return; }; sleep 0.1; done
  log "not answering; see $RUN_DIR/$NAME.log"; exit 1
}

# The pid file's redis-server, if it is still one (a pid may have been reused).
own_pid() {
  local pid
  pid=$(cat "$PID_FILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "redis-server" ] && echo "$pid"
}

# SHUTDOWN (bounded: a stopped or overloaded server may never answer), then the pid file's process
# until it is gone: a server that did not answer in time or refused the shutdown would be left running.
stop() {
  local pid
  timeout 10 redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  if pid=$(own_pid); then
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then log "pid $pid did not shut down: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  log "stopped"
  rm -f "$PID_FILE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if answering; then echo running; else echo stopped; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
