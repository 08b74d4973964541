#!/usr/bin/env bash
# run_browser_test.sh WORKDIR: the chat page at / (src/server/web/chat.html) in a real browser:
# Debian's Chromium (scripts/setup.sh installs it), headless, driven by playwright-core from npm
# (browser/package.json, pinned by its package-lock.json, installed with npm ci into WORKDIR,
# again only when the lockfile changed), against two `lily serve` on the trained lily-tiny: one
# without a key, one with --api-key. Runs browser/chat_page.test.mjs and stops the servers.
# Env: LILY_BINARY (required); LILY_CHROMIUM (default /usr/bin/chromium).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run_browser_test.sh WORKDIR}"
: "${LILY_BINARY:?set LILY_BINARY to the lily executable}"
# The test asks lily-tiny questions it can answer; the random-weight tiny-chat cannot.
export LILY_TEST_MODEL="$here/../../models/lily-tiny"
export LILY_CHROMIUM="${LILY_CHROMIUM:-/usr/bin/chromium}"

for tool in node npm curl; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAIL: '$tool' is not installed; the chat page test needs node >= 20, npm and curl" >&2
    exit 1
  fi
done
if [ ! -x "$LILY_CHROMIUM" ]; then
  echo "FAIL: no Chromium at $LILY_CHROMIUM; the chat page test drives a real browser: install Debian's" \
    "chromium package (scripts/setup.sh does), or set LILY_CHROMIUM to a Chromium executable" >&2
  exit 1
fi

mkdir -p "$work"
cp "$here/browser/package.json" "$here/browser/package-lock.json" "$here"/browser/*.mjs "$work/"
if [ ! -d "$work/node_modules/playwright-core" ] || ! cmp -s "$here/browser/package-lock.json" "$work/node_modules/.lily-lock"; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error)
  cp "$here/browser/package-lock.json" "$work/node_modules/.lily-lock"
fi

source "$here/lib_server.sh"
export LILY_KEY="page-test-key"
key_pid=""
stop_servers() {
  local status=0
  stop_lily_server || status=1
  LILY_PID="$key_pid"
  stop_lily_server || status=1
  return $status
}
trap stop_servers EXIT
start_lily_server "$work/server-key.log" --api-key "$LILY_KEY"
key_pid="$LILY_PID"
export LILY_KEY_URL="$LILY_URL"
start_lily_server "$work/server.log"
export LILY_URL

status=0
(cd "$work" && node --test --test-concurrency=1 ./chat_page.test.mjs) || status=$?
trap - EXIT
stop_servers || status=1
exit $status
