#!/usr/bin/env bash
# run_node_tests.sh WORKDIR [ONLY [EXCEPT]]: the official `openai` npm client against a real
# `lily serve`. Installs the client from the committed lockfile into WORKDIR (npm ci, once),
# starts the server on a free port with the test model, runs `node --test` on the *.test.mjs
# files whose names match the extended regex ONLY (default: all) and not EXCEPT, and stops the
# server. (CTest runs them in two groups, each under its time limit: tests/server/CMakeLists.txt.)
# Env: LILY_BINARY (required), LILY_TEST_MODEL (default: tests/server/fixtures/tiny-chat).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run_node_tests.sh WORKDIR [ONLY [EXCEPT]]}"
only="${2:-}"
except="${3:-}"
: "${LILY_BINARY:?set LILY_BINARY to the lily executable}"
export LILY_TEST_MODEL="${LILY_TEST_MODEL:-$here/fixtures/tiny-chat}"

for tool in node npm curl; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; the server tests need node >= 20, npm and curl" >&2
    exit 1
  fi
done
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
  echo "FAIL: node $(node --version) is too old; the server tests need node >= 20" >&2
  exit 1
fi

source "$here/lib_server.sh"
serve_for_node_client "$work"
status=0
files=()
for f in *.test.mjs; do
  if [ -n "$only" ] && ! grep -Eq -- "$only" <<<"$f"; then continue; fi
  if [ -n "$except" ] && grep -Eq -- "$except" <<<"$f"; then continue; fi
  files+=("./$f")
done
if ((${#files[@]} == 0)); then echo "FAIL: no test file matches '$only' (except '$except')" >&2; exit 1; fi
node --test --test-concurrency=1 "${files[@]}" || status=$?
trap - EXIT
stop_lily_server || status=1
exit $status
