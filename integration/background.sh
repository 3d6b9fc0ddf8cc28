# Steps run in the background beside others, for .ci/run and integration/test.sh (sourced).
# Their output is kept aside and printed when collected; a failing one stops the script with its
# output and its name; whatever is still running is stopped, and the logs removed, however the
# script ends.
bg_pids=()
bg_logs=()
trap 'kill "${bg_pids[@]}" 2> /dev/null || true; rm -f "${bg_logs[@]}"' EXIT
# Run a command in the background, its output kept aside; sets bg_pid and bg_log for `collect`.
in_background() {
  bg_log="$(mktemp)"
  bg_logs+=("$bg_log")
  "$@" > "$bg_log" 2>&1 &
  bg_pid=$!
  bg_pids+=("$bg_pid")
}
# Wait for background job PID, print its output LOG, and stop here if it failed (naming WHAT).
collect() {
  local pid="$1" log="$2" what="$3" status=0
  wait "$pid" || status=$?
  cat "$log"
  if [ "$status" -ne 0 ]; then
    echo "${0##*/}: $what failed (its output above)" >&2
    exit 1
  fi
}
