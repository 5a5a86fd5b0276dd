#!/bin/sh
# Entry point of the llmbus containers: the principal's password and the Redis password, mounted as
# compose secrets (each container gets only its own two files), go into the environment of this process
# only (never into the compose file).
set -eu
LLMBUS_KAFKA_SASL_PASSWORD=$(cat "/run/secrets/${LLMBUS_KAFKA_SASL_USERNAME:?}")
LLMBUS_REDIS_PASSWORD=$(cat /run/secrets/redis)
export LLMBUS_KAFKA_SASL_PASSWORD LLMBUS_REDIS_PASSWORD
# The autoscaler's local actuator starts engine-workers in its own container: they connect as the
# engine-worker principal (its secret is mounted there too), never as the autoscaler.
if [ "$LLMBUS_KAFKA_SASL_USERNAME" = autoscaler ] && [ -r /run/secrets/engine-worker ]; then
  LLMBUS_AUTOSCALER_WORKER_ENV=$(python -c 'import json, sys; print(json.dumps({"LLMBUS_KAFKA_SASL_USERNAME": "engine-worker", "LLMBUS_KAFKA_SASL_PASSWORD": sys.stdin.read().strip()}))' < /run/secrets/engine-worker)
  export LLMBUS_AUTOSCALER_WORKER_ENV
fi
exec "$@"
