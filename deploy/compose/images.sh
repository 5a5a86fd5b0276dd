#!/usr/bin/env bash
# Builds the compose stack's images on this machine, from Debian packages, PyPI and Maven Central alone:
# llmbus:dev, llmbus/kafka:4.1.1, llmbus/redis:7, llmbus/s3proxy:4.1.0, llmbus/prometheus:2 and llmbus/otelcol:0.116.0 (the
# collector from its Go modules: deploy/otel/build.sh) (deploy/compose/local-images.yml).
# The base (BASE_IMAGE, default debian:bookworm-slim) is made with debootstrap when the engine lacks it.
# An extra CA bundle for pip (TLS-intercepting proxies): EXTRA_CA_BUNDLE=/path/ca.pem (default: the
# system bundle, when it exists); a BuildKit secret, used during the build and never stored in an image.
# Layers are cached by the engine: a second run with nothing changed takes seconds.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BASE_IMAGE=${BASE_IMAGE:-debian:bookworm-slim}
KAFKA_VERSION=${KAFKA_VERSION:-4.1.1}
CACHE=${LLMBUS_CACHE:-$HOME/.cache/llmbus}
EXTRA_CA_BUNDLE=${EXTRA_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
# BuildKit (for the secret) is built into Debian's docker CLI; a newer CLI needs the buildx plugin.
DOCKER=${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )}
export DOCKER_BUILDKIT=1

log() { echo "[images] $*" >&2; }

build() {  # build TAG DOCKERFILE CONTEXT [docker build options]
  local tag=$1 dockerfile=$2 context=$3 started=$SECONDS
  shift 3
  "$DOCKER" build -q --network host --build-arg BASE_IMAGE="$BASE_IMAGE" -f "$dockerfile" -t "$tag" "$@" "$context" >/dev/null
  log "$tag built in $((SECONDS - started)) s"
}

"$HERE/base-image.sh" "$BASE_IMAGE"
secret=()
[ -s "$EXTRA_CA_BUNDLE" ] && secret=(--secret "id=ca,src=$EXTRA_CA_BUNDLE")
build llmbus:dev "$HERE/Dockerfile" "$REPO" "${secret[@]}"
KAFKA_VERSION=$KAFKA_VERSION "$REPO/deploy/kafka/kafka.sh" fetch
build "llmbus/kafka:$KAFKA_VERSION" "$HERE/images/kafka.Dockerfile" "$CACHE/kafka-$KAFKA_VERSION"
build llmbus/redis:7 "$HERE/images/redis.Dockerfile" "$HERE/images"
S3PROXY_VERSION=${S3PROXY_VERSION:-4.1.0}
S3PROXY_VERSION=$S3PROXY_VERSION "$REPO/deploy/objectstore/objectstore.sh" fetch
build "llmbus/s3proxy:$S3PROXY_VERSION" "$HERE/images/objectstore.Dockerfile" "$CACHE/s3proxy-$S3PROXY_VERSION"
build llmbus/prometheus:2 "$HERE/images/prometheus.Dockerfile" "$HERE/images"
OTELCOL_DIR=$CACHE/otelcol
if [ ! -x "$OTELCOL_DIR/otelcol-llmbus" ]; then
  log "building the OpenTelemetry Collector from its Go modules (once; minutes)"
  "$REPO/deploy/otel/build.sh"
fi
build llmbus/otelcol:0.116.0 "$HERE/images/otelcol.Dockerfile" "$OTELCOL_DIR"
