#!/bin/sh
# Redis with AUTH from the generated secret (in a config file, not on the command line) and persistence:
# API keys, exactly-once markers, the cost outbox and held results live here, so every write goes to
# the append-only file (fsync every second) in the `redis-data` volume and survives a restart.
set -eu
umask 077
printf 'requirepass "%s"\n' "$(cat /run/secrets/redis)" >/tmp/redis.conf
exec redis-server /tmp/redis.conf --bind 127.0.0.1 --port "${REDIS_PORT:?}" --dir /data \
  --appendonly yes --appendfsync everysec --save ""
