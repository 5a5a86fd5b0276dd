#!/bin/sh
# Redis with its ACL users (the generated secret `redis-users`: `default` with the `redis` password, every
# right, for backups and health checks; each service its own user, only its own keys and commands;
# passwords as SHA-256) and persistence: API keys, exactly-once markers, the cost outbox and held results
# live here, so every write goes to the append-only file (fsync every second) in the `redis-data` volume
# and survives a restart.
set -eu
exec redis-server --aclfile /run/secrets/redis-users --bind 127.0.0.1 --port "${REDIS_PORT:?}" --dir /data \
  --appendonly yes --appendfsync everysec --save ""
