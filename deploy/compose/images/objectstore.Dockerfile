# S3Proxy (the object store) without Docker Hub: Debian's JRE and the server's jars from Maven Central,
# fetched by deploy/objectstore/objectstore.sh (org.gaul:s3proxy and its runtime dependencies). The build
# context is that directory of jars:
#   deploy/objectstore/objectstore.sh fetch
#   DOCKER_BUILDKIT=1 docker build --network host -f deploy/compose/images/objectstore.Dockerfile \
#     -t llmbus/s3proxy:4.1.0 ~/.cache/llmbus/s3proxy-4.1.0
# deploy/compose/security/objectstore-run.sh starts it, or the official andrewgaul/s3proxy image, the same way;
# its data (a bucket per directory, an object per file) lives in /data.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --no-create-home --home-dir /nonexistent appuser \
 && install -d -o 1000 -g 1000 /data
COPY libs /opt/s3proxy/libs
RUN rm -f /opt/s3proxy/libs/.complete
USER 1000:1000
