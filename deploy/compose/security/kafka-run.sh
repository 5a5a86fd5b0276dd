#!/bin/sh
# The compose stack's broker: KRaft, one node, SASL/SCRAM-SHA-512 for clients and the broker itself,
# SASL PLAIN (admin only) on the controller listener, ACLs enforced (StandardAuthorizer, super user admin).
# The same configuration as `KAFKA_AUTH=scram deploy/kafka/kafka.sh start`, the tested local broker.
# Runs in the official apache/kafka image and in deploy/compose/images/kafka.Dockerfile alike: both keep
# the jars in /opt/kafka/libs with `java` on PATH.
#   kafka-run.sh format   once, with every principal's password mounted (/run/secrets/*): formats the
#                         storage with a SCRAM user per principal (skipped when already formatted)
#   kafka-run.sh serve    the broker, which reads only the admin password
#   kafka-run.sh config   print the broker's configuration (tests/unit/test_compose_stack.py checks it)
set -eu
SECRETS_DIR=${SECRETS_DIR:-/run/secrets}
PORT=${KAFKA_PORT:?} CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:?}
DATA_DIR=${KAFKA_DATA_DIR:-/var/lib/kafka/data}
LIBS=${KAFKA_LIBS:-/opt/kafka/libs}
PROPERTIES=${KAFKA_PROPERTIES:-/tmp/server.properties}
admin_pw=$(cat "$SECRETS_DIR/admin")
umask 077
cat >"$PROPERTIES" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$CONTROLLER_PORT
listeners=SASL_PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=SASL_PLAINTEXT
listener.security.protocol.map=CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT
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
log.dirs=$DATA_DIR
num.partitions=4
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.consumer.heartbeat.interval.ms=1000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.session.timeout.ms=10000
group.consumer.min.session.timeout.ms=6000
log.retention.hours=168
PROPS
java_run() {
  exec_or_run=$1; shift
  $exec_or_run java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile=/opt/llmbus/log4j2.properties -cp "$LIBS/*" "$@"
}
case "${1:-serve}" in
  format)
    if [ -f "$DATA_DIR/meta.properties" ]; then echo "storage already formatted"; exit 0; fi
    set --
    users=0
    for file in "$SECRETS_DIR"/*; do
      user=$(basename "$file")
      [ "$user" = redis ] && continue
      set -- "$@" --add-scram "SCRAM-SHA-512=[name=$user,password=$(cat "$file")]"
      users=$((users + 1))
    done
    # A random cluster id (16 bytes, base64url) that does not start with "-" (the tool takes it for an option).
    cluster_id=-
    while [ "${cluster_id#-}" != "$cluster_id" ]; do
      cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
    done
    java_run "" kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$PROPERTIES" "$@" >/dev/null
    echo "storage formatted (cluster $cluster_id, $users SCRAM users)"
    ;;
  serve) java_run exec kafka.Kafka "$PROPERTIES" ;;
  config) cat "$PROPERTIES" ;;
  *) echo "usage: $0 format|serve|config" >&2; exit 2 ;;
esac
