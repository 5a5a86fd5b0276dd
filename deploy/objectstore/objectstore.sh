#!/usr/bin/env bash
# Local S3-compatible object store for llmbus (model artifacts, the archive's bucket target): S3Proxy
# (Apache-2.0, org.gaul:s3proxy) fetched as Maven artifacts into a cache outside git, its filesystem
# backend (a bucket is a directory, an object a file) in $LLMBUS_CACHE/objectstore-data, the S3 API on
# 127.0.0.1:9000 and Prometheus /metrics (requests by S3 operation and bucket) on 127.0.0.1:9001.
# Usage: deploy/objectstore/objectstore.sh start|stop|status|fetch|reset|env   (all idempotent)
#   env: the LLMBUS_S3_* settings that reach this store, as shell lines (eval "$(objectstore.sh env)").
#
# Why S3Proxy and not SeaweedFS (both Apache-2.0; MinIO's server is AGPL), measured on the project's 2-core
# machine with the same client work (a tiny model pushed and fetched, an 80 MiB object put and got twice):
#   S3Proxy 4.1.0 (this script): no build, 57 MB of jars from Maven Central (25 s with a cold Maven cache);
#     ready 1.2-1.5 s after launch at 0.9 CPU-s, 83 MB resident; after the work 3.9 CPU-s, 367 MB;
#     an 80 MiB put 1.9 s, get 0.2-0.3 s (C1 alone: the same work took 5.6 CPU-s with C2, 2.7 s to ready).
#   SeaweedFS (weed server -s3, its Go module at v0.0.0-20261109003541-7506e5f91cd6): a 353 s build
#     (nice, -p 1) from 2.1 GB of module sources into a 233 MB binary; ready 2.2 s at 0.17 CPU-s, 149 MB;
#     after the work 1.3 CPU-s, 459 MB; an 80 MiB put 1.2 s, get 0.17 s.
# SeaweedFS moves bytes with less CPU; S3Proxy starts sooner, holds less memory, needs no build, and is
# one process over plain files (a bucket is a directory, an object a file: nothing to recover but the
# files), where SeaweedFS runs a master, a volume server, a filer and an S3 gateway over its own volume
# format. For llmbus (models pushed once, fetched once per node; the archive's batches) that wins.
# It does multipart uploads, ranged GETs (resumed downloads) and signature v4, and counts requests by
# S3 operation and bucket on /metrics (the tests count GetObject there).
#
# Credentials: an access key and a secret generated once into $RUN_DIR/objectstore.credentials
# (access_key=..., secret_key=..., mode 600) unless OBJECTSTORE_ACCESS_KEY / OBJECTSTORE_SECRET_KEY are set;
# llmbus reads that file when LLMBUS_S3_ACCESS_KEY / LLMBUS_S3_SECRET_KEY are unset (llmbus.settings).
# OBJECTSTORE_JVM_FLAGS: the server's JVM flags (default -Xms32m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1).
# A second, private store takes its own port, data dir and name:
#   OBJECTSTORE_PORT=19000 OBJECTSTORE_DATA_DIR=/tmp/x OBJECTSTORE_NAME=objectstore-19000 objectstore.sh start
set -euo pipefail

VERSION=${S3PROXY_VERSION:-4.1.0}
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
HOME_DIR=$CACHE/s3proxy-$VERSION
LIBS=$HOME_DIR/libs
DATA_DIR=${OBJECTSTORE_DATA_DIR:-$CACHE/objectstore-data}
RUN_DIR=${OBJECTSTORE_RUN_DIR:-$CACHE/run}
NAME=${OBJECTSTORE_NAME:-objectstore}  # pid, log, properties and credentials of this store: $RUN_DIR/$NAME.*
PID_FILE=$RUN_DIR/$NAME.pid
LOG_FILE=$RUN_DIR/$NAME.log
PROPERTIES=$RUN_DIR/$NAME.properties
CREDENTIALS=${OBJECTSTORE_CREDENTIALS:-$RUN_DIR/$NAME.credentials}
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=${OBJECTSTORE_PORT:-9000}
METRICS_PORT=${OBJECTSTORE_METRICS_PORT:-$((PORT + 1))}
READY_TIMEOUT_S=${OBJECTSTORE_READY_TIMEOUT_S:-60}
STOP_GRACE_S=${OBJECTSTORE_STOP_GRACE_S:-10}
# C1 alone and the serial collector: a small server whose work is moving bytes between sockets and files.
read -r -a JVM_FLAGS <<<"${OBJECTSTORE_JVM_FLAGS:--Xms32m -Xmx512m -XX:+UseSerialGC -XX:TieredStopAtLevel=1}"

log() { echo "[objectstore] $*" >&2; }
# shellcheck source=../lib/server.sh
. "$HERE/../lib/server.sh"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

fetch() {
  if [ -f "$LIBS/.complete" ]; then return; fi
  log "fetching org.gaul:s3proxy:$VERSION and its dependencies from Maven Central"
  maven_fetch "$HERE/pom.xml" "$LIBS" -Ds3proxy.version="$VERSION"
}

value_of() { sed -n "s/^$1=//p" "$CREDENTIALS" | head -1; }

make_credentials() {
  mkdir -p "$(dirname "$CREDENTIALS")"
  if [ -n "${OBJECTSTORE_ACCESS_KEY:-}" ] && [ -n "${OBJECTSTORE_SECRET_KEY:-}" ]; then
    (umask 077; printf 'access_key=%s\nsecret_key=%s\n' "$OBJECTSTORE_ACCESS_KEY" "$OBJECTSTORE_SECRET_KEY" >"$CREDENTIALS")
    return
  fi
  [ -s "$CREDENTIALS" ] && return
  (umask 077; printf 'access_key=llmbus-%s\nsecret_key=%s\n' "$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')" \
    "$(head -c 30 /dev/urandom | base64 | tr -d '/+=')" >"$CREDENTIALS")
  log "generated credentials in $CREDENTIALS"
}

write_properties() {
  (umask 077; cat >"$PROPERTIES" <<PROPS
# Written by deploy/objectstore/objectstore.sh at each start.
s3proxy.endpoint=http://127.0.0.1:$PORT
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=$(value_of access_key)
s3proxy.credential=$(value_of secret_key)
jclouds.provider=filesystem
jclouds.filesystem.basedir=$DATA_DIR
s3proxy.metrics.enabled=true
s3proxy.metrics.port=$METRICS_PORT
s3proxy.metrics.host=127.0.0.1
PROPS
  )
}

running_pid() { pid_running "$PID_FILE" "org.gaul.s3proxy.Main --properties $PROPERTIES"; }

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    if port_open "$PORT" && port_open "$METRICS_PORT"; then log "ready on 127.0.0.1:$PORT (metrics :$METRICS_PORT)"; return 0; fi
    if ! pid_alive "$PID_FILE"; then log "server exited; see $LOG_FILE"; tail -20 "$LOG_FILE" >&2 || true; return 1; fi
    sleep 0.1
  done
  log "not ready after ${READY_TIMEOUT_S}s; see $LOG_FILE"; return 1
}

start() {
  if running_pid >/dev/null; then log "already running (pid $(running_pid))"; wait_ready; return; fi
  if port_open "$PORT"; then log "something already answers on 127.0.0.1:$PORT; using it"; return; fi
  fetch
  mkdir -p "$RUN_DIR" "$DATA_DIR"
  make_credentials
  write_properties
  : >"$LOG_FILE"
  rm -f "$PID_FILE"
  log "starting S3Proxy $VERSION (data: $DATA_DIR, logs: $LOG_FILE)"
  # The server writes its own pid (the JVM's, through exec) so stop/status see the real process.
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
    java "${JVM_FLAGS[@]}" -Djava.awt.headless=true -Dlogback.configurationFile="$HERE/logback.xml" \
    -cp "$LIBS/*" org.gaul.s3proxy.Main --properties "$PROPERTIES" >>"$LOG_FILE" 2>&1 </dev/null &
  for _ in $(seq 1 100); do [ -s "$PID_FILE" ] && break; sleep 0.05; done
  wait_ready
}

stop() {
  local pid
  if ! pid=$(running_pid); then log "not running"; rm -f "$PID_FILE"; return; fi
  log "stopping pid $pid"
  stop_pid "$pid" "$STOP_GRACE_S" || true
  rm -f "$PID_FILE"
}

print_env() {
  [ -s "$CREDENTIALS" ] || { log "no credentials yet: start the store first"; exit 1; }
  echo "LLMBUS_S3_ENDPOINT=http://127.0.0.1:$PORT"
  echo "LLMBUS_S3_ACCESS_KEY=$(value_of access_key)"
  echo "LLMBUS_S3_SECRET_KEY=$(value_of secret_key)"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if running_pid >/dev/null; then echo "running (pid $(running_pid))"; else echo "stopped"; exit 1; fi ;;
  reset) stop; rm -rf "$DATA_DIR"; log "data removed" ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|fetch|reset|env" >&2; exit 2 ;;
esac
