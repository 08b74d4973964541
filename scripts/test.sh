#!/usr/bin/env bash
# Builds lily and runs every test that this machine can run (GPU tests skip without a GPU).
# This is the README's test command and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
build_dir=${LILY_BUILD_DIR:-build}
cmake -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LILY_CMAKE_ARGS:-} >/dev/null
cmake --build "$build_dir" -j "$(nproc)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" "$@"
