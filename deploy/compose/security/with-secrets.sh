#!/bin/sh
# Entry point of the llmbus containers: the principal's password and the Redis password, mounted as
# compose secrets (each container gets only its own two files), go into the environment of this process
# only (never into the compose file).
set -eu
LLMBUS_KAFKA_SASL_PASSWORD=$(cat "/run/secrets/${LLMBUS_KAFKA_SASL_USERNAME:?}")
LLMBUS_REDIS_PASSWORD=$(cat /run/secrets/redis)
export LLMBUS_KAFKA_SASL_PASSWORD LLMBUS_REDIS_PASSWORD
exec "$@"
