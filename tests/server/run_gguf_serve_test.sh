#!/usr/bin/env bash
# run_gguf_serve_test.sh WORKDIR: `lily serve -m FILE.gguf` with nothing beside the file, the
# tokenizer taken from the GGUF's own vocabulary (tokenizer.ggml.*, docs/gguf.md): a chat
# completion and a streamed one answer, and /health names the model.
# Env: LILY_BINARY (required), LILY_FIXTURES_DIR (default: tests/fixtures).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run_gguf_serve_test.sh WORKDIR}"
: "${LILY_BINARY:?set LILY_BINARY to the lily executable}"
fixtures="${LILY_FIXTURES_DIR:-$here/../fixtures}"
command -v curl >/dev/null || { echo "FAIL: curl is not installed" >&2; exit 1; }
mkdir -p "$work/alone"
# The GGUF alone in its folder: no tokenizer.json, config.json or generation_config.json.
cp "$fixtures/models/tiny-a/gguf/tiny-a-q8_0.gguf" "$work/alone/"
export LILY_TEST_MODEL="$work/alone/tiny-a-q8_0.gguf"
source "$here/lib_server.sh"
trap stop_lily_server EXIT
start_lily_server "$work/gguf-server.log" || { cat "$work/gguf-server.log"; exit 1; }

failures=0
check() {  # check NAME REGEX FILE
  if grep -Eq -- "$2" "$3"; then echo "ok   $1"; else
    echo "FAIL $1: expected /$2/, got: $(head -c 300 "$3")"
    failures=$((failures + 1))
  fi
}
json=(-H 'Content-Type: application/json')
curl -s "$LILY_URL/v1/chat/completions" "${json[@]}" -o "$work/chat" \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}'
check "chat completion" '"finish_reason":"(length|stop)"' "$work/chat"
check "chat completion usage" '"completion_tokens":[1-4]\b' "$work/chat"
curl -sN "$LILY_URL/v1/chat/completions" "${json[@]}" -o "$work/stream" \
  -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"stream":true}'
check "streamed completion" 'data: \[DONE\]' "$work/stream"
curl -s "$LILY_URL/health" -o "$work/health"
check "health" '"status":"ok"' "$work/health"
[ "$failures" -eq 0 ] && echo "all gguf serve checks passed"
exit "$failures"
