#!/usr/bin/env bash
# The Flink job's environment, idempotent and quick when already done: PyFlink in its own
# virtualenv (its pins clash with the project's) and the Kafka connector jars from Maven Central.
#   LLMBUS_FLINK_VENV  where the venv lives   (default ~/.cache/llmbus/flink-venv)
#   LLMBUS_FLINK_JARS  where the jars go      (default ~/.cache/llmbus/flink/jars)
set -euo pipefail
cd "$(dirname "$0")"

VENV=${LLMBUS_FLINK_VENV:-$HOME/.cache/llmbus/flink-venv}
JARS=${LLMBUS_FLINK_JARS:-$HOME/.cache/llmbus/flink/jars}
MAVEN=${LLMBUS_MAVEN_REPO:-https://repo1.maven.org/maven2}
log() { echo "[analytics-setup] $*" >&2; }

command -v java >/dev/null || { log "Java 11 or 17 is needed (make setup installs it)"; exit 1; }
PY=$(command -v python3.11 || command -v python3)
"$PY" -c 'import sys; assert (3, 8) <= sys.version_info[:2] <= (3, 11), sys.version' ||
  { log "PyFlink 1.20 needs Python 3.8-3.11"; exit 1; }

mark="$VENV/.llmbus-$(sha256sum requirements.txt | cut -c1-16)"
if [ ! -f "$mark" ]; then
  [ -x "$VENV/bin/python" ] || { log "creating virtualenv $VENV"; "$PY" -m venv "$VENV"; }
  log "installing PyFlink into $VENV (first time: a few minutes, ~300 MB)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install --progress-bar off -r requirements.txt | grep -E '^(Collecting|Successfully)' >&2 || true
  "$VENV/bin/python" -c 'import pyflink.table' || { log "PyFlink did not install"; exit 1; }
  touch "$mark"
fi

mkdir -p "$JARS"
grep -v '^#' jars.txt | while read -r path sha1; do
  jar="$JARS/$(basename "$path")"
  if [ -f "$jar" ] && [ "$(sha1sum "$jar" | cut -d' ' -f1)" = "$sha1" ]; then continue; fi
  log "downloading $(basename "$path")"
  curl -fsSL --retry 3 -o "$jar.part" "$MAVEN/$path"
  [ "$(sha1sum "$jar.part" | cut -d' ' -f1)" = "$sha1" ] || { log "checksum mismatch: $path"; rm -f "$jar.part"; exit 1; }
  mv "$jar.part" "$jar"
done
log "ready: $VENV, jars in $JARS"
