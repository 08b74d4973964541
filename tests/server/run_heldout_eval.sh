#!/usr/bin/env bash
# run_heldout_eval.sh WORKDIR: issue 5's measurement. Starts `lily serve` on models/lily-tiny
# (LILY_BINARY, default build/lily) and runs node/heldout_eval.mjs over every held-out
# arithmetic question and tool call with the official openai client. A few minutes on CPU.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
work="${1:?usage: run_heldout_eval.sh WORKDIR}"
export LILY_BINARY="${LILY_BINARY:-$root/build/lily}"
export LILY_TEST_MODEL="$root/models/lily-tiny"

source "$here/lib_server.sh"
serve_for_node_client "$work"
node heldout_eval.mjs "$LILY_TEST_MODEL/heldout.json"
