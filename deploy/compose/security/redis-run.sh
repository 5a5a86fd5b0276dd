#!/bin/sh
# Redis with AUTH from the generated secret; the password goes in a config file, not on the command line.
set -eu
umask 077
printf 'requirepass "%s"\n' "$(cat /secrets/redis)" >/tmp/redis.conf
exec redis-server /tmp/redis.conf --save "" --appendonly no
