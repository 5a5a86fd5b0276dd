#!/usr/bin/env bash
# Docker Compose v2 where no package provides it (Debian 12 has only 1.29): built from its Go module
# through the Go module proxy into ~/.cache/llmbus/bin/docker-compose (~80 s on 2 cores, once).
# The build runs inside the module cache directory: compose's go.mod has replace directives, which
# `go install module@version` refuses.
set -euo pipefail
VERSION=${COMPOSE_VERSION:-v2.29.7}
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
OUT=$CACHE/bin/docker-compose
# shellcheck source=../lib/go.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../lib/go.sh"
use_go compose-v2
mkdir -p "$CACHE/bin"
go mod download "github.com/docker/compose/v2@$VERSION"
cd "$(go env GOMODCACHE)/github.com/docker/compose/v2@$VERSION"
GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$VERSION" -o "$OUT.tmp" ./cmd
mv "$OUT.tmp" "$OUT"
echo "[compose-v2] $("$OUT" version)" >&2
