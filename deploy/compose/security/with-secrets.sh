#!/bin/sh
# Entry point of the llmbus containers: the principal's password, mounted as a compose secret (each
# container gets only its own file), goes into the environment of this process only (never into the
# compose file): for Kafka, and for Redis where the container has a Redis user (LLMBUS_REDIS_USERNAME,
# the same principal and password; llmbus.security.redis_acls). The archive has none: no Redis at all.
# Where mounted, the object store's secret key goes the same way.
set -eu
LLMBUS_KAFKA_SASL_PASSWORD=$(cat "/run/secrets/${LLMBUS_KAFKA_SASL_USERNAME:?}")
export LLMBUS_KAFKA_SASL_PASSWORD
if [ -n "${LLMBUS_REDIS_USERNAME:-}" ]; then
  LLMBUS_REDIS_PASSWORD=$(cat "/run/secrets/${LLMBUS_REDIS_USERNAME}")
  export LLMBUS_REDIS_PASSWORD
fi
# The object store's secret key, in the containers that reach it (the archive, the cli, vLLM workers).
if [ -r /run/secrets/objectstore ]; then
  LLMBUS_S3_SECRET_KEY=$(cat /run/secrets/objectstore)
  export LLMBUS_S3_SECRET_KEY
fi
# The autoscaler's local actuator starts engine-workers in its own container: they connect as the
# engine-worker principal (its secret is mounted there too), to Kafka and Redis, never as the autoscaler.
if [ "$LLMBUS_KAFKA_SASL_USERNAME" = autoscaler ] && [ -r /run/secrets/engine-worker ]; then
  LLMBUS_AUTOSCALER_WORKER_ENV=$(python -c 'import json, sys; pw = sys.stdin.read().strip(); print(json.dumps({"LLMBUS_KAFKA_SASL_USERNAME": "engine-worker", "LLMBUS_KAFKA_SASL_PASSWORD": pw, "LLMBUS_REDIS_USERNAME": "engine-worker", "LLMBUS_REDIS_PASSWORD": pw}))' < /run/secrets/engine-worker)
  export LLMBUS_AUTOSCALER_WORKER_ENV
fi
exec "$@"
