#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a LILY_FUZZ build, each for a bounded time from its committed
# seed corpus (scripts/test.sh's fuzz phase; docs/fuzzing.md has the longer local runs).
#
#   tests/fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]     (default: every harness)
#
# Up to $(nproc) harnesses run at once. New inputs a run finds go to BUILD_DIR/fuzz-out/NAME/
# corpus (the committed corpus is only read); a crash, a sanitizer report, a leak, a timeout
# (10 s on one input) or an out-of-memory (2 GB) leaves its reproducer in BUILD_DIR/fuzz-out/NAME/
# and fails the run: replay it with `BUILD_DIR/tests/fuzz/fuzz_NAME FILE`, fix the bug, and add
# the file to tests/fuzz/corpus/NAME/ so every build replays it (ctest fuzz_replay_NAME).
set -euo pipefail
cd "$(dirname "$0")/../.."

build_dir=${1:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
seconds=${2:?usage: tests/fuzz/run.sh BUILD_DIR SECONDS [HARNESS...]}
shift 2
harnesses=("$@")
[ ${#harnesses[@]} -gt 0 ] || harnesses=(request safetensors gguf config output_parser)

run_one() {  # run_one NAME: one harness; its log in fuzz-out/NAME.log
  local name=$1 out=$build_dir/fuzz-out/$1
  rm -rf "$out"
  mkdir -p "$out/corpus"
  # malloc_context_size=0: no stack recorded per allocation, 2.5-3x the executions per second
  # (replay a reproducer without it for the allocation stacks); leaks are still found.
  ASAN_OPTIONS=${ASAN_OPTIONS:-malloc_context_size=0:detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "$build_dir/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus" "tests/fuzz/corpus/$name" \
    >"$build_dir/fuzz-out/$name.log" 2>&1
}

mkdir -p "$build_dir/fuzz-out"
jobs_max=$(nproc)
declare -A pids
failed=0
for name in "${harnesses[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do sleep 1; done
  run_one "$name" &
  pids[$name]=$!
done
for name in "${harnesses[@]}"; do
  log=$build_dir/fuzz-out/$name.log
  if wait "${pids[$name]}"; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    echo "fuzz_$name: ${runs:-?} executions in ${seconds} s, no finding"
  else
    failed=1
    echo "fuzz_$name: FAILED (reproducer in $build_dir/fuzz-out/$name/); the end of its log:"
    tail -40 "$log"
  fi
done
exit $failed
