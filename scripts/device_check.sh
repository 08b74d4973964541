#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with .carry/ from scripts/device_bundle.sh:
# the CUDA tests, compute-sanitizer on the kernel tests, and a benchmark sweep. Logs go to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# The binaries were built in /work/main: fixtures and the embedded model are found there.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
echo "== CUDA tests"
for t in .carry/tests/cuda_test_*; do
  echo "-- $t"; timeout 120 "$t" 2>&1 | tail -n 40
done 2>&1 | tee "$OUT/cuda_tests.txt"
echo "== compute-sanitizer"
for t in ${SANITIZE:-cuda_test_gemv cuda_test_moe cuda_test_norm cuda_test_deltanet cuda_test_attention}; do
  for tool in memcheck racecheck; do
    echo "-- $tool $t"; timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 ".carry/tests/$t" --gtest_brief=1 2>&1 | tail -n 8
  done
done 2>&1 | tee "$OUT/sanitizer.txt"
echo "== bench"
timeout ${BENCH_TIMEOUT:-150} .carry/lily bench --synthetic ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
