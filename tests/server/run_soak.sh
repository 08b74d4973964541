#!/usr/bin/env bash
# run_soak.sh WORKDIR [SECONDS]: node/soak.mjs against its own `lily serve` (default 20 s; the
# issue 17 soak is 120). Installs the openai client into WORKDIR like run_node_tests.sh.
# Env: LILY_BINARY (required), LILY_TEST_MODEL (default: tests/server/fixtures/tiny-chat),
# LILY_SANITIZED=1 (memory reported, not checked).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="${1:?usage: run_soak.sh WORKDIR [SECONDS]}"
seconds="${2:-20}"
: "${LILY_BINARY:?set LILY_BINARY to the lily executable}"
export LILY_TEST_MODEL="${LILY_TEST_MODEL:-$here/fixtures/tiny-chat}"
source "$here/lib_server.sh"
install_node_client "$work"
cd "$work"
node soak.mjs "$seconds"
