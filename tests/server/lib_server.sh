# lib_server.sh: start / stop a `lily serve` for the script tests (sourced).
#   start_lily_server LOGFILE [extra serve args...]  -> sets LILY_URL and LILY_PID
#   stop_lily_server
# LILY_BINARY: the lily executable; LILY_TEST_MODEL: the model directory.

start_lily_server() {
  local log="$1"; shift
  "$LILY_BINARY" serve -m "$LILY_TEST_MODEL" --port 0 --ctx-size 2048 "$@" >"$log" 2>&1 &
  LILY_PID=$!
  LILY_URL=""
  for _ in $(seq 1 300); do
    LILY_URL=$(grep -o 'http://[^ ]*' "$log" | head -1 || true)
    if [ -n "$LILY_URL" ] && curl -sf "$LILY_URL/health" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$LILY_PID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "lily serve did not start; its log:" >&2
  cat "$log" >&2
  return 1
}

stop_lily_server() {
  if [ -n "${LILY_PID:-}" ] && kill -0 "$LILY_PID" 2>/dev/null; then
    kill -TERM "$LILY_PID"
    for _ in $(seq 1 100); do kill -0 "$LILY_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$LILY_PID" 2>/dev/null; then
      echo "lily serve did not stop on SIGTERM within 10 s" >&2
      kill -KILL "$LILY_PID"
      return 1
    fi
    wait "$LILY_PID" 2>/dev/null
    local rc=$?
    if [ "$rc" -ne 0 ]; then echo "lily serve exited with $rc after SIGTERM" >&2; return 1; fi
  fi
  return 0
}
