# Apache Kafka without Docker Hub: Debian's JRE and the broker's jars from Maven Central, fetched by
# deploy/kafka/kafka.sh (org.apache.kafka:kafka_2.13 and its runtime dependencies). The build context is
# that directory of jars:
#   deploy/kafka/kafka.sh fetch
#   DOCKER_BUILDKIT=1 docker build --network host -f deploy/compose/images/kafka.Dockerfile \
#     -t llmbus/kafka:4.1.1 ~/.cache/llmbus/kafka-4.1.1
# The layout is the part of the official apache/kafka image the stack uses: jars in /opt/kafka/libs and
# `java` on PATH, so deploy/compose/security/kafka-run.sh starts either image the same way.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 1000 --no-create-home --home-dir /nonexistent appuser \
 && install -d -o 1000 -g 1000 /var/lib/kafka/data
COPY libs /opt/kafka/libs
RUN rm -f /opt/kafka/libs/.complete
USER 1000:1000
