#!/bin/sh
# Starts the apache/kafka image's broker with the generated admin password (compose, secured by default):
# PLAIN (admin only) on the controller and inter-broker paths, SCRAM-SHA-512 for everyone else.
set -eu
pw=$(cat /secrets/admin)
jaas="org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"$pw\" user_admin=\"$pw\";"
export KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG="$jaas"
export KAFKA_LISTENER_NAME_CONTROLLER_PLAIN_SASL_JAAS_CONFIG="$jaas"
umask 077
cat >/tmp/admin.properties <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$pw";
PROPS
exec /etc/kafka/docker/run
