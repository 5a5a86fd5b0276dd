# Redis without Docker Hub: Debian's redis-server. Data in /data (AOF; deploy/compose/security/redis-run.sh).
#   DOCKER_BUILDKIT=1 docker build --network host -f deploy/compose/images/redis.Dockerfile -t llmbus/redis:7 .
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o redis -g redis /data
WORKDIR /data
