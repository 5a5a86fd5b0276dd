# The OpenTelemetry Collector without Docker Hub: the static binary deploy/otel/build.sh makes from the
# collector's Go modules, on the Debian base. The build context is its directory:
#   deploy/otel/build.sh
#   DOCKER_BUILDKIT=1 docker build --network host -f deploy/compose/images/otelcol.Dockerfile \
#     -t llmbus/otelcol:0.116.0 ~/.cache/llmbus/otelcol
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
COPY otelcol-llmbus /usr/local/bin/otelcol-llmbus
USER nobody
ENTRYPOINT ["/usr/local/bin/otelcol-llmbus"]
