#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with .carry/carry.tar.xz made by
# scripts/device_bundle.sh: the CUDA tests, a benchmark sweep, then compute-sanitizer on the
# kernel tests. Logs go to $OUT (each part has its own time limit so the rest still runs).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "import tarfile; tarfile.open('.carry/carry.tar.xz').extractall('.')"
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}"
# The binaries were built in /work/main: fixtures and the embedded model are found there.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
for t in .carry/tests/cuda_test_*; do
  echo "-- $t"; timeout ${TEST_TIMEOUT:-40} "$t" 2>&1 | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|error|Expected|Which is|actual|^\[.*\] gpu|first divergence|max \|" | head -n 60
  echo "exit ${PIPESTATUS[0]}"
done > "$OUT/cuda_tests.txt" 2>&1
cat "$OUT/cuda_tests.txt" | grep -E "^-- |PASSED|FAILED \]|exit" 
timeout ${BENCH_TIMEOUT:-120} .carry/lily bench --synthetic ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1; echo "bench exit $?" >> "$OUT/bench.txt"
cat "$OUT/bench.txt" | tail -n 20
for t in ${SANITIZE:-cuda_test_norm cuda_test_deltanet cuda_test_attention cuda_test_gemv cuda_test_moe cuda_test_gemm_q4 cuda_test_moe_grouped}; do
  for tool in memcheck racecheck; do
    echo "-- $tool $t"; timeout ${SANITIZE_TIMEOUT:-25} compute-sanitizer --tool $tool --error-exitcode 9 ".carry/tests/$t" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | tail -n 4; echo "exit ${PIPESTATUS[0]}"
  done
done > "$OUT/sanitizer.txt" 2>&1
cat "$OUT/sanitizer.txt"
