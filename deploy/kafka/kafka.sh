#!/usr/bin/env bash
# Local Apache Kafka (KRaft, single node) for llmbus: fetched as Maven artifacts into a
# cache outside git, storage formatted once, broker on 127.0.0.1:9092.
# Usage: deploy/kafka/kafka.sh start|stop|status|fetch|reset   (all idempotent)
# A second, private broker (the reliability tests stop and restart one) takes its own port,
# data dir and name: KAFKA_PORT=19092 KAFKA_DATA_DIR=/tmp/x KAFKA_NAME=kafka-19092 kafka.sh start
set -euo pipefail

KAFKA_VERSION=${KAFKA_VERSION:-4.1.1}
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
HOME_DIR=$CACHE/kafka-$KAFKA_VERSION
LIBS=$HOME_DIR/libs
DATA_DIR=${KAFKA_DATA_DIR:-$CACHE/kafka-data}
RUN_DIR=${KAFKA_RUN_DIR:-$CACHE/run}
NAME=${KAFKA_NAME:-kafka}  # pid, log and config files of this broker: $RUN_DIR/$NAME.*
PID_FILE=$RUN_DIR/$NAME.pid
LOG_FILE=$RUN_DIR/$NAME.log
HERE=$(cd "$(dirname "$0")" && pwd)
PORT=${KAFKA_PORT:-9092}
CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}
PROPERTIES=$RUN_DIR/$NAME.server.properties
READY_TIMEOUT_S=${KAFKA_READY_TIMEOUT_S:-90}

log() { echo "[kafka] $*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

fetch() {
  if [ -f "$LIBS/.complete" ]; then return; fi
  log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its dependencies from Maven Central"
  command -v mvn >/dev/null || { log "mvn not found: apt-get install -y maven"; exit 1; }
  mkdir -p "$LIBS"
  mvn -q -B -f "$HERE/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$LIBS"
  touch "$LIBS/.complete"
}

java_run() {
  java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
    -cp "$LIBS/*" "$@"
}

format_storage() {
  mkdir -p "$RUN_DIR" "$DATA_DIR"
  sed -e "s#@DATA_DIR@#$DATA_DIR#" -e "s#@PORT@#$PORT#g" -e "s#@CONTROLLER_PORT@#$CONTROLLER_PORT#g" \
    "$HERE/server.properties" >"$PROPERTIES"
  if [ -f "$DATA_DIR/meta.properties" ]; then return; fi
  local cluster_id
  cluster_id=$(java_run kafka.tools.StorageTool random-uuid)
  log "formatting KRaft storage in $DATA_DIR (cluster $cluster_id)"
  java_run kafka.tools.StorageTool format --standalone -t "$cluster_id" \
    -c "$PROPERTIES" >/dev/null
}

running_pid() {
  [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null && cat "$PID_FILE"
}

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    if port_open && grep -q "Kafka Server started\|started (kafka.server" "$LOG_FILE" 2>/dev/null; then
      log "ready on 127.0.0.1:$PORT"; return 0
    fi
    if ! running_pid >/dev/null; then log "broker exited; see $LOG_FILE"; tail -20 "$LOG_FILE" >&2 || true; return 1; fi
    sleep 0.5
  done
  log "not ready after ${READY_TIMEOUT_S}s; see $LOG_FILE"; return 1
}

start() {
  if running_pid >/dev/null; then log "already running (pid $(running_pid))"; wait_ready; return; fi
  if port_open; then log "something already answers on 127.0.0.1:$PORT; using it"; return; fi
  fetch
  format_storage
  : >"$LOG_FILE"
  log "starting broker (logs: $LOG_FILE)"
  # The broker writes its own pid (the JVM's, through exec) so stop/status see the real process.
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
    java -Xms256m -Xmx768m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
    -cp "$LIBS/*" kafka.Kafka "$PROPERTIES" \
    >>"$RUN_DIR/$NAME.stdout" 2>&1 </dev/null &
  for _ in $(seq 1 20); do [ -s "$PID_FILE" ] && break; sleep 0.1; done
  wait_ready
}

stop() {
  local pid
  if ! pid=$(running_pid); then log "not running"; rm -f "$PID_FILE"; return; fi
  log "stopping pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -0 "$pid" 2>/dev/null && { log "still alive after 30s; killing"; kill -KILL "$pid"; }
  rm -f "$PID_FILE"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if running_pid >/dev/null; then echo "running (pid $(running_pid))"; else echo "stopped"; exit 1; fi ;;
  reset) stop; rm -rf "$DATA_DIR"; log "data removed" ;;
  *) echo "usage: $0 start|stop|status|fetch|reset" >&2; exit 2 ;;
esac
