# Sourced by the scripts that run a local server from the project's cache (deploy/kafka/kafka.sh,
# deploy/objectstore/objectstore.sh): fetching its jars from Maven Central, finding it by its pid file,
# stopping it. The sourcing script defines log().

# maven_fetch POM LIBS [-Dname=value ...]: the pom's runtime dependencies copied into LIBS, once.
maven_fetch() {
  local pom=$1 libs=$2
  shift 2
  [ -f "$libs/.complete" ] && return
  command -v mvn >/dev/null || { log "mvn not found: apt-get install -y maven"; exit 1; }
  mkdir -p "$libs"
  mvn -q -B -Dstyle.color=never -f "$pom" "$@" \
    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs"
  touch "$libs/.complete"
}

# pid_running PID_FILE COMMAND: the pid file's process if its command line still holds COMMAND (a pid
# file left by a server that died with its machine may name a dead or a reused pid).
pid_running() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$2" && echo "$pid"
}

# pid_alive PID_FILE: the pid file's process still exists. What a start waits on: a broker just started may
# show no command line for a moment while its shell execs the JVM (seen under load: `pid_running` said
# "exited" at once while the broker went on to start), and a pid is not reused within a start's wait.
pid_alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# stop_pid PID GRACE_S: SIGTERM, SIGKILL after GRACE_S seconds; returns 1 when it had to kill.
stop_pid() {
  local pid=$1 grace_s=$2 i  # not `_`: bash sets $_ to each command's last argument
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < grace_s * 10; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  log "still alive after ${grace_s}s; killing"
  kill -KILL "$pid" 2>/dev/null || true
  return 1
}
