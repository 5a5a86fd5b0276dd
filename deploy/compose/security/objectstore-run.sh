#!/bin/sh
# The object store (S3Proxy, deploy/objectstore) as deploy/objectstore/objectstore.sh configures it: signature
# v4 with the stack's key (the secret key from the `objectstore` secret, in a properties file, never on the
# command line), its filesystem backend in the objectstore-data volume (/data), 127.0.0.1 only, /metrics on
# its own port. Either image: ours (jars in /opt/s3proxy/libs) or the official andrewgaul/s3proxy (the
# executable jar /opt/s3proxy/s3proxy).
set -eu
umask 077
cat >/tmp/s3proxy.properties <<PROPS
s3proxy.endpoint=http://127.0.0.1:${OBJECTSTORE_PORT:?}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=${OBJECTSTORE_ACCESS_KEY:?}
s3proxy.credential=$(cat /run/secrets/objectstore)
jclouds.provider=filesystem
jclouds.filesystem.basedir=/data
s3proxy.metrics.enabled=true
s3proxy.metrics.port=${OBJECTSTORE_METRICS_PORT:?}
s3proxy.metrics.host=127.0.0.1
PROPS
if [ -d /opt/s3proxy/libs ]; then
  exec java -Xms32m -Xmx512m -XX:+UseSerialGC -Dlogback.configurationFile=/opt/llmbus/logback.xml \
    -cp "/opt/s3proxy/libs/*" org.gaul.s3proxy.Main --properties /tmp/s3proxy.properties
fi
exec java -XX:MaxRAMPercentage=75 -DLOG_LEVEL=info -jar /opt/s3proxy/s3proxy --properties /tmp/s3proxy.properties
