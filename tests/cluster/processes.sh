# shellcheck shell=bash
# Process helpers shared by up.sh, down.sh and real-node.sh (sourced; one copy of the rules).
#
# A process is ours when its pid file $PIDS/NAME.pid names a live process whose command line mentions
# "$PROCESS_MARK/" (the directory it was started from), so a recycled pid is never mistaken for ours.
# The including script sets PIDS, LOGS and PROCESS_MARK before calling these.

# process_is_ours PID: alive and started by us.
process_is_ours() {
  local cmdline
  cmdline="$( { tr '\0' ' ' < "/proc/$1/cmdline"; } 2>/dev/null)" || return 1
  [[ "$cmdline" == *"$PROCESS_MARK/"* ]]
}

# pid_of NAME: prints the pid of our NAME process, if it runs.
pid_of() {
  local file="$PIDS/$1.pid" pid
  [ -s "$file" ] || return 1
  pid="$(cat "$file")"
  process_is_ours "$pid" || return 1
  echo "$pid"
}

# start_detached NAME CMD...: runs CMD in its own session (neither Ctrl-C nor the end of the calling
# make/CI step kills it), logs to $LOGS/NAME.log, records the pid. The small bash -c writes its own pid and
# then execs CMD, so the pid file names the process itself, not a wrapper. 9>&-: the process must not
# inherit the cluster's lock descriptor (it would hold the lock forever). Fails if no pid within 5 s.
start_detached() {
  local name="$1" _
  shift
  rm -f "$PIDS/$name.pid"
  # shellcheck disable=SC2016 # $$ and $@ are for the inner shell
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$PIDS/$name.pid" "$@" >"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  for _ in $(seq 50); do [ -s "$PIDS/$name.pid" ] && return 0; sleep 0.1; done
  return 1
}

# stop_process NAME [GRACE_SECONDS]: SIGTERM, up to GRACE seconds (default 10) for it to exit, then
# SIGKILL. The processes are not children of the calling shell, so "wait" cannot be used: /proc is
# polled. Removes the pid file. Idempotent: a process that is not running is fine.
stop_process() {
  local name="$1" grace="${2:-10}" pid _
  if pid="$(pid_of "$name")"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq $((grace * 10))); do process_is_ours "$pid" || break; sleep 0.1; done
    if process_is_ours "$pid"; then
      printf '%s (pid %s) ignored SIGTERM for %ss; sending SIGKILL\n' "$name" "$pid" "$grace" >&2
      kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 50); do process_is_ours "$pid" || break; sleep 0.1; done
    fi
  fi
  rm -f "$PIDS/$name.pid"
}
