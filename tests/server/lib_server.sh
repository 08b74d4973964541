# lib_server.sh: start / stop a `lily serve` for the script tests (sourced).
#   start_lily_server LOGFILE [extra serve args...]  -> sets LILY_URL and LILY_PID
#   stop_lily_server
#   install_node_client WORKDIR  -> the node scripts and the openai client (npm ci, once per lockfile)
#   serve_for_node_client WORKDIR -> both of the above for the node scripts: the client in
#     WORKDIR, a server (stopped at exit) whose LILY_URL is exported; leaves the shell in WORKDIR
# LILY_BINARY: the lily executable; LILY_TEST_MODEL: the model directory.

start_lily_server() {
  local log="$1"; shift
  "$LILY_BINARY" serve -m "$LILY_TEST_MODEL" --port 0 --ctx-size 2048 "$@" >"$log" 2>&1 &
  LILY_PID=$!
  LILY_URL=""
  for _ in $(seq 1 300); do
    LILY_URL=$(grep -o 'listening on http://[^ ]*' "$log" | head -1 | cut -d' ' -f3 || true)
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

# Copies tests/server/node's scripts into WORKDIR and installs the openai client from the
# committed lockfile there (npm ci), again only when the lockfile changed.
install_node_client() {
  local work="$1" node_dir
  node_dir="$(dirname "${BASH_SOURCE[0]}")/node"
  mkdir -p "$work"
  cp "$node_dir/package.json" "$node_dir/package-lock.json" "$node_dir"/*.mjs "$work/"
  if [ ! -d "$work/node_modules/openai" ] || ! cmp -s "$node_dir/package-lock.json" "$work/node_modules/.lily-lock"; then
    (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
    cp "$node_dir/package-lock.json" "$work/node_modules/.lily-lock"
  fi
}

# The node scripts' setting: the client installed in WORKDIR, `lily serve` started (its log in
# WORKDIR/server.log, stopped when the script exits), LILY_URL exported, the shell in WORKDIR.
serve_for_node_client() {
  local work="$1"
  install_node_client "$work"
  trap stop_lily_server EXIT
  start_lily_server "$work/server.log"
  export LILY_URL
  cd "$work"
}
