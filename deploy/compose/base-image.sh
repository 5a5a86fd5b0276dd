#!/usr/bin/env bash
# The base image of the stack's Dockerfiles, made without a registry: `debian:bookworm-slim` from
# debootstrap (minbase) and the Debian mirror this machine's apt already uses, imported into the engine.
# Does nothing when the engine already has the image (pulled or made before).
# Usage: deploy/compose/base-image.sh [IMAGE]   (default debian:bookworm-slim; mirror: DEBIAN_MIRROR=...)
set -euo pipefail
IMAGE=${1:-debian:bookworm-slim}
log() { echo "[base-image] $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then log "$IMAGE present"; exit 0; fi

mirror() {
  # The first Debian (not -security) mirror in apt's sources, one-line or deb822 format.
  { grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | awk '{print $2}'
    grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'; } \
    | grep -E '/debian/?$' | head -1
}
MIRROR=${DEBIAN_MIRROR:-$(mirror)}
[ -n "$MIRROR" ] || { log "no Debian mirror in apt's sources; set DEBIAN_MIRROR"; exit 1; }
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
fi
ROOTFS=$(mktemp -d /tmp/llmbus-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT
log "debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"
# Slim as the official image: no apt lists or caches in the layer.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb
tar -C "$ROOTFS" -c . | docker import - "$IMAGE" >/dev/null
log "imported $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
