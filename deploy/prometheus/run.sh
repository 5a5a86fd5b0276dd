#!/bin/sh
# Prometheus of the compose stack (official image or deploy/compose/images/prometheus.Dockerfile): the
# scrape targets' ports carry the stack's port prefix, filled in here, then the server on 127.0.0.1,
# serving the three dashboard layers (deploy/prometheus/consoles/) at /consoles/.
set -eu
P=${LLMBUS_PORT_PREFIX:?}
sed "s/@P@/$P/g" /etc/prometheus/prometheus.yml.in >/tmp/prometheus.yml
exec prometheus --config.file=/tmp/prometheus.yml --storage.tsdb.path=/prometheus \
  --web.listen-address="127.0.0.1:${P}9090" --storage.tsdb.retention.time=7d \
  --web.console.templates=/etc/prometheus/consoles --web.console.libraries=/etc/prometheus/console_libraries
