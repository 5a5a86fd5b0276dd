#!/usr/bin/env bash
# The OpenTelemetry Collector (core components: OTLP in, batch, debug/OTLP out) built from its Go
# modules through the Go module proxy, where no image registry serves otel/opentelemetry-collector:
# OpenTelemetry's own builder (ocb) v0.116.0 with deploy/otel/builder-config.yaml, a static binary in
# ~/.cache/llmbus/otelcol/otelcol-llmbus (minutes on 2 cores, once). deploy/compose/images.sh puts it in
# the llmbus/otelcol image.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
OUT=$CACHE/otelcol
[ -x "$OUT/otelcol-llmbus" ] && exit 0
# shellcheck source=../lib/go.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../lib/go.sh"
use_go otelcol
mkdir -p "$OUT"
cp "$HERE/builder-config.yaml" "$OUT/builder-config.yaml"
cd "$OUT"
CGO_ENABLED=0 go run go.opentelemetry.io/collector/cmd/builder@v0.116.0 --config builder-config.yaml >build.log 2>&1 \
  || { tail -20 build.log >&2; exit 1; }
mv otelcol/otelcol-llmbus otelcol-llmbus
echo "[otelcol] built $OUT/otelcol-llmbus" >&2
