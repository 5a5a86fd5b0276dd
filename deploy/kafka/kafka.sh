#!/usr/bin/env bash
# Local Apache Kafka (KRaft, single node) for llmbus: fetched as Maven artifacts into a
# cache outside git, storage formatted once, broker on 127.0.0.1:9092.
# Usage: deploy/kafka/kafka.sh start|stop|status|fetch|reset   (all idempotent)
# KAFKA_BROKER_JVM_FLAGS: the broker's JVM flags (default -Xms256m -Xmx768m -XX:+UseG1GC).
# KAFKA_STOP_GRACE_S: how long `stop` waits for a controlled shutdown before SIGKILL (default 30).
# KAFKA_CDS=0: no class-data-sharing archive (by default the first clean exit writes one, later starts map it).
# A second, private broker (the reliability tests stop and restart one) takes its own port,
# data dir and name: KAFKA_PORT=19092 KAFKA_DATA_DIR=/tmp/x KAFKA_NAME=kafka-19092 kafka.sh start
#
# Secured broker (docs/security.md): KAFKA_AUTH=scram kafka.sh start
#   clients: SASL_PLAINTEXT + SCRAM-SHA-512 on $PORT; controller listener: SASL PLAIN (admin only);
#   StandardAuthorizer, super user `admin`, allow.everyone.if.no.acl.found=false (no ACL, no access).
#   SCRAM users are created when the storage is formatted: admin, one per service, `operator`, `analytics`, and
#   `tenant-<name>` for each of KAFKA_TENANTS. Their passwords are generated once into
#   $RUN_DIR/$NAME.credentials (user=password lines, mode 600) unless that file already exists.
#   kafka.sh add-user NAME [PASSWORD]: a user more on a running secured broker (a new tenant).
#   ACLs come from the topic catalog: `llmbus acl apply` (after start).
# TLS as well (KAFKA_AUTH=scram KAFKA_TLS=1): a SASL_SSL listener on $TLS_PORT (default PORT+2)
#   with a certificate for 127.0.0.1/localhost signed by a local CA made once with openssl in
#   $RUN_DIR/$NAME.tls/ (ca.crt is what clients trust: LLMBUS_KAFKA_SECURITY_PROTOCOL=SASL_SSL,
#   LLMBUS_KAFKA_SSL_CAFILE=.../ca.crt). The SASL_PLAINTEXT listener stays for the broker itself.
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
# How long `stop` waits for a controlled shutdown before SIGKILL. A throwaway test broker (its data
# removed afterwards) may take 0: on two busy cores its controlled shutdown took up to a minute.
STOP_GRACE_S=${KAFKA_STOP_GRACE_S:-30}
AUTH=${KAFKA_AUTH:-none}  # none | scram
CREDENTIALS=${KAFKA_CREDENTIALS:-$RUN_DIR/$NAME.credentials}
SERVICE_USERS="router scheduler engine-worker shadow-comparator autoscaler cost-accounting gateway archive node-agent operator analytics"
TENANTS=${KAFKA_TENANTS:-acme globex}
TLS=${KAFKA_TLS:-0}
TLS_PORT=${KAFKA_TLS_PORT:-$((PORT + 2))}
# The broker's JVM flags; a short-lived test broker may trade steady-state speed for a cheaper start.
read -r -a BROKER_JVM_FLAGS <<<"${KAFKA_BROKER_JVM_FLAGS:--Xms256m -Xmx768m -XX:+UseG1GC}"
# The one-shot tools (storage format, SCRAM users) run for seconds: the C1 compiler alone and the serial
# collector (storage format measured 4.6 -> 2.6 CPU-s on 2 cores).
TOOL_JVM_FLAGS=(-Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC)
TLS_DIR=$RUN_DIR/$NAME.tls
# Class data sharing (KAFKA_CDS=0 turns it off): see cds_archive.
CDS=${KAFKA_CDS:-1}
CDS_DIR=$CACHE/kafka-cds-$KAFKA_VERSION  # not inside $HOME_DIR: that is the Kafka image's build context
CDS_WRITTEN=$RUN_DIR/$NAME.jsa  # the archive this broker writes at a clean exit when none was there

log() { echo "[kafka] $*" >&2; }
# shellcheck source=../lib/server.sh
. "$HERE/../lib/server.sh"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

fetch() {
  if [ -f "$LIBS/.complete" ]; then return; fi
  log "fetching org.apache.kafka:kafka_2.13:$KAFKA_VERSION and its dependencies from Maven Central"
  maven_fetch "$HERE/pom.xml" "$LIBS" -Dkafka.version="$KAFKA_VERSION"
}

# Class data sharing (a JDK 13+ dynamic archive): the classes one JVM of a kind (broker, tool) loaded,
# archived when it exits cleanly, are mapped by every later start of that kind instead of being loaded and
# verified again. Measured on 2 cores (KAFKA_CDS=0 and 1 taking turns): a test broker 2.9 -> 1.6 CPU-s to
# ready, its storage format 1.5 -> 0.85. One archive per kind and JVM build (another JVM would refuse it).
cds_archive() {
  local java_bin
  java_bin=$(readlink -f "$(command -v java)")
  mkdir -p "$CDS_DIR"
  echo "$CDS_DIR/$1-$({ echo "$java_bin"; stat -c '%s %Y' "$(dirname "$java_bin")/../lib/server/libjvm.so" 2>/dev/null || true; } | md5sum | cut -c1-12).jsa"
}

# The JVM flag that maps `archive`, or (none yet) writes one into `written` at exit.
cds_flags() {
  local archive=$1 written=$2
  if [ "$CDS" != 1 ]; then echo "-Xshare:auto"; elif [ -s "$archive" ]; then echo "-XX:SharedArchiveFile=$archive"
  else rm -f "$written"; echo "-XX:ArchiveClassesAtExit=$written"; fi
}

# What a JVM wrote at its clean exit, put in place whole (a start never maps a half-written one).
cds_keep() {
  local written=$1 archive=$2
  if [ -s "$written" ] && [ ! -s "$archive" ]; then cp "$written" "$archive.$$" && mv -f "$archive.$$" "$archive"; fi
  rm -f "$written"
}

java_run() {
  local archive written=$RUN_DIR/$NAME.tool-$$.jsa
  archive=$(cds_archive tool)
  local rc=0
  java "${TOOL_JVM_FLAGS[@]}" "$(cds_flags "$archive" "$written")" -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
    -cp "$LIBS/*" "$@" || rc=$?
  cds_keep "$written" "$archive"
  return $rc
}

password_of() { sed -n "s/^$1=//p" "$CREDENTIALS" | head -1; }

make_credentials() {
  [ -f "$CREDENTIALS" ] && return
  mkdir -p "$(dirname "$CREDENTIALS")"
  (umask 077; for user in admin $SERVICE_USERS $(for t in $TENANTS; do echo "tenant-$t"; done); do
    echo "$user=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
  done >"$CREDENTIALS")
  log "generated SCRAM credentials in $CREDENTIALS"
}

make_tls() {
  # A local CA and the broker's certificate (SAN 127.0.0.1, localhost), PKCS12 for the JVM.
  [ -f "$TLS_DIR/broker.p12" ] && return
  command -v openssl >/dev/null || { log "KAFKA_TLS=1 needs openssl"; exit 1; }
  mkdir -p "$TLS_DIR"
  (umask 077
   local pw
   pw=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
   echo "$pw" >"$TLS_DIR/keystore.password"
   openssl req -x509 -newkey rsa:2048 -nodes -days 825 -subj "/CN=llmbus local CA" \
     -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.crt" 2>/dev/null
   openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
     -keyout "$TLS_DIR/broker.key" -out "$TLS_DIR/broker.csr" 2>/dev/null
   printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$TLS_DIR/broker.ext"
   openssl x509 -req -in "$TLS_DIR/broker.csr" -CA "$TLS_DIR/ca.crt" -CAkey "$TLS_DIR/ca.key" \
     -CAcreateserial -days 825 -extfile "$TLS_DIR/broker.ext" -out "$TLS_DIR/broker.crt" 2>/dev/null
   openssl pkcs12 -export -in "$TLS_DIR/broker.crt" -inkey "$TLS_DIR/broker.key" -certfile "$TLS_DIR/ca.crt" \
     -name broker -passout "pass:$pw" -out "$TLS_DIR/broker.p12")
  chmod 644 "$TLS_DIR/ca.crt"
  log "local CA and broker certificate in $TLS_DIR (clients trust ca.crt)"
}

write_properties() {
  sed -e "s#@DATA_DIR@#$DATA_DIR#" -e "s#@PORT@#$PORT#g" -e "s#@CONTROLLER_PORT@#$CONTROLLER_PORT#g" \
    "$HERE/server.properties" >"$PROPERTIES"
  [ "$AUTH" = scram ] || return 0
  local admin_pw tls_listener=""
  admin_pw=$(password_of admin)
  [ "$TLS" = 1 ] && tls_listener=",SASL_SSL://127.0.0.1:$TLS_PORT"
  sed -i -e '/^listeners=/d' -e '/^advertised.listeners=/d' -e '/^inter.broker.listener.name=/d' \
    -e '/^listener.security.protocol.map=/d' "$PROPERTIES"
  (umask 077; cat >>"$PROPERTIES" <<PROPS
# KAFKA_AUTH=scram (kafka.sh): SASL/SCRAM for clients and the broker itself, ACLs enforced.
listeners=SASL_PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT$tls_listener
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$PORT$tls_listener
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL
sasl.enabled.mechanisms=SCRAM-SHA-512
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$admin_pw";
# SCRAM credentials live in the metadata log the controller serves, so the controller listener uses PLAIN.
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$admin_pw" user_admin="$admin_pw";
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false
PROPS
  )
  if [ "$TLS" = 1 ]; then
    cat >>"$PROPERTIES" <<PROPS
# KAFKA_TLS=1: the same SCRAM users over TLS (certificate from the local CA in $TLS_DIR).
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$TLS_DIR/broker.p12
ssl.keystore.password=$(cat "$TLS_DIR/keystore.password")
ssl.client.auth=none
PROPS
  fi
  chmod 600 "$PROPERTIES"
}

format_storage() {
  mkdir -p "$RUN_DIR" "$DATA_DIR"
  [ "$AUTH" = scram ] && make_credentials
  if [ "$TLS" = 1 ]; then
    [ "$AUTH" = scram ] || { log "KAFKA_TLS=1 needs KAFKA_AUTH=scram"; exit 2; }
    make_tls
  fi
  write_properties
  if [ -f "$DATA_DIR/meta.properties" ]; then return; fi
  local cluster_id scram=()
  # A random Kafka Uuid (16 bytes, base64url) without starting a JVM for it; not one starting with
  # "-" (1 in 64), which the storage tool's argument parser takes for an option.
  cluster_id=-
  while [[ $cluster_id == -* ]]; do
    cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  done
  if [ "$AUTH" = scram ]; then
    while IFS='=' read -r user pw; do
      [ -n "$user" ] && scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$pw]")
    done <"$CREDENTIALS"
  fi
  log "formatting KRaft storage in $DATA_DIR (cluster $cluster_id, auth $AUTH)"
  java_run kafka.tools.StorageTool format --standalone -t "$cluster_id" \
    -c "$PROPERTIES" "${scram[@]}" >/dev/null
}

add_user() {
  local user=${1:?usage: kafka.sh add-user NAME [PASSWORD]} pw=${2:-}
  [ "$AUTH" = scram ] || { log "add-user needs KAFKA_AUTH=scram"; exit 2; }
  [ -n "$pw" ] || pw=$(password_of "$user")
  [ -n "$pw" ] || pw=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  local admin_config=$RUN_DIR/$NAME.admin.properties
  (umask 077; cat >"$admin_config" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(password_of admin)";
PROPS
  )
  timeout 60 java "${TOOL_JVM_FLAGS[@]}" -cp "$LIBS/*" -Dlog4j2.configurationFile="$HERE/log4j2.properties" \
    -Dkafka.logs.file="$LOG_FILE" kafka.admin.ConfigCommand --bootstrap-server "127.0.0.1:$PORT" \
    --command-config "$admin_config" --alter --entity-type users --entity-name "$user" \
    --add-config "SCRAM-SHA-512=[password=$pw]" >/dev/null
  grep -q "^$user=" "$CREDENTIALS" || (umask 077; echo "$user=$pw" >>"$CREDENTIALS")
  log "SCRAM user $user ready"
}

# The pid file's broker, if it is still one: a pid file left by a broker that died with its machine (or a
# session) may name a dead or reused pid.
running_pid() { pid_running "$PID_FILE" "kafka.Kafka $PROPERTIES"; }

wait_ready() {
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  while [ $SECONDS -lt $deadline ]; do
    if port_open && grep -q "Kafka Server started\|started (kafka.server" "$LOG_FILE" 2>/dev/null; then
      log "ready on 127.0.0.1:$PORT"; return 0
    fi
    if ! pid_alive "$PID_FILE"; then log "broker exited; see $LOG_FILE"; tail -20 "$LOG_FILE" >&2 || true; return 1; fi
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
  rm -f "$PID_FILE"  # a stale one would read as this broker, dead, before it has written its own
  log "starting broker (logs: $LOG_FILE)"
  # The broker writes its own pid (the JVM's, through exec) so stop/status see the real process.
  setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PID_FILE" \
    java "${BROKER_JVM_FLAGS[@]}" "$(cds_flags "$(cds_archive broker)" "$CDS_WRITTEN")" -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/log4j2.properties" -Dkafka.logs.file="$LOG_FILE" \
    -cp "$LIBS/*" kafka.Kafka "$PROPERTIES" \
    >>"$RUN_DIR/$NAME.stdout" 2>&1 </dev/null &
  for _ in $(seq 1 100); do [ -s "$PID_FILE" ] && break; sleep 0.1; done
  wait_ready
}

stop() {
  local pid
  if ! pid=$(running_pid); then log "not running"; rm -f "$PID_FILE"; return; fi
  log "stopping pid $pid"
  if stop_pid "$pid" "$STOP_GRACE_S"; then
    cds_keep "$CDS_WRITTEN" "$(cds_archive broker)"
  else
    rm -f "$CDS_WRITTEN"  # cut short: what it wrote is not whole
  fi
  rm -f "$PID_FILE"
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if running_pid >/dev/null; then echo "running (pid $(running_pid))"; else echo "stopped"; exit 1; fi ;;
  reset) stop; rm -rf "$DATA_DIR"; if [ "$AUTH" = scram ]; then rm -rf "$CREDENTIALS" "$TLS_DIR"; fi; log "data removed" ;;
  add-user) shift; add_user "$@" ;;
  *) echo "usage: $0 start|stop|status|fetch|reset|add-user NAME [PASSWORD]" >&2; exit 2 ;;
esac
