#!/bin/sh
# One-shot (compose `kafka-users`): a SCRAM-SHA-512 user for every generated credential but admin
# (PLAIN, in the broker's JAAS) and redis (Redis AUTH). Idempotent: altering a user resets its password.
set -eu
umask 077
cat >/tmp/admin.properties <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$(cat /secrets/admin)";
PROPS
for file in /secrets/*; do
  user=$(basename "$file")
  case "$user" in admin|redis) continue ;; esac
  timeout 120 /opt/kafka/bin/kafka-configs.sh --bootstrap-server kafka:9092 --command-config /tmp/admin.properties \
    --alter --entity-type users --entity-name "$user" --add-config "SCRAM-SHA-512=[password=$(cat "$file")]" >/dev/null
  echo "SCRAM user $user"
done
