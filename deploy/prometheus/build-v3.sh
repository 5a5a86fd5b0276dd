#!/usr/bin/env bash
# Prometheus 3 (the compose file's official prom/prometheus:v3.0.1) built from its Go module through the
# Go module proxy, where no image registry serves it: ~/.cache/llmbus/prometheus-3.0.1/prometheus
# (minutes on 2 cores, once). The compose smoke runs it beside the stack's own Prometheus (Debian's 2.x)
# on the same targets, so the alert rules, the scrapes and the consoles are checked on both majors.
# A v3 release is module version v0.300.x. Only the file and HTTP service discoveries are compiled in
# (the stack's targets are static; the other discoveries pull in every cloud's SDK), and no web UI
# (its assets are built with npm): the API, the rules and /consoles/ are Prometheus' own code.
set -euo pipefail
VERSION=${PROMETHEUS_V3_VERSION:-3.0.1}
MODULE_VERSION=v0.$(echo "$VERSION" | awk -F. '{printf "%d%02d.%d", $1, $2, $3}')
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
OUT=$CACHE/prometheus-$VERSION
[ -x "$OUT/prometheus" ] && exit 0
# shellcheck source=../lib/go.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../lib/go.sh"
use_go prometheus-3
mkdir -p "$OUT"
go mod download "github.com/prometheus/prometheus@$MODULE_VERSION"
SRC=$(mktemp -d /tmp/llmbus-prometheus-src.XXXXXX)
trap 'chmod -R u+w "$SRC"; rm -rf "$SRC"' EXIT
cp -r "$(go env GOMODCACHE)/github.com/prometheus/prometheus@$MODULE_VERSION/." "$SRC"
chmod -R u+w "$SRC"
# plugins/plugins.go registers every service discovery; plugins/minimum.go keeps file and HTTP.
printf 'package plugins\n' >"$SRC/plugins/plugins.go"
cd "$SRC"
GOFLAGS=-mod=mod go build -ldflags "-s -w -X github.com/prometheus/common/version.Version=$VERSION" \
  -o "$OUT/prometheus.tmp" ./cmd/prometheus >"$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log" >&2; exit 1; }
mv "$OUT/prometheus.tmp" "$OUT/prometheus"
echo "[prometheus-3] built $("$OUT/prometheus" --version 2>&1 | head -1)" >&2
