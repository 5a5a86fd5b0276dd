# Prometheus without Docker Hub: Debian's package (the server only; no exporters).
#   DOCKER_BUILDKIT=1 docker build --network host -f deploy/compose/images/prometheus.Dockerfile -t llmbus/prometheus:2 .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o nobody -g nogroup /prometheus
USER nobody
