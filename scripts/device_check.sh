#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with .carry/carry.tar.xz made by
# scripts/device_bundle.sh: the CUDA tests, a benchmark sweep, compute-sanitizer on the kernel
# tests. Logs go to $OUT; each part has its own time limit so the rest still runs.
#   PHASES="tests bench sanitize" (default all three, in that order); "backend" runs the runtime
#   tests that take LILY_TEST_BACKEND=cuda (session reuse through the ChatService, lily-tiny e2e);
#   "parallel" runs the CUDA test programs and the backend tests all at once (16 cores: their
#   CPU references dominate; results in one file); "ab" alternates `lily bench --synthetic
#   $BENCH_ARGS` between .carry-before/.carry-before/lily (scripts/device_bundle.sh's output of an
#   earlier commit, moved there) and .carry/lily, AB_ROUNDS times (default 2)
#   BENCH_ARGS="..." (lily bench --synthetic arguments), BENCH_TIMEOUT, TEST_TIMEOUT,
#   SANITIZE="cuda_test_x[:gtest-filter] ...", SANITIZE_TOOLS (default "memcheck racecheck"),
#   SANITIZE_TIMEOUT; "kernels" times every kernel of two decode
#   steps at DEPTH (default 4096) with ncu, one at a time (tools/ncu_summary.py); "timeline"
#   traces 8 steps as they run in the graph with nsys (tools/nsys_timeline.py: in-graph
#   durations and the gaps between kernels); "rows" times steps of ROWS (default "1 2 4 8") rows at
#   DEPTH, verify and batch kinds, under the plan edits ROWS_PLAN (comma separated, e.g.
#   "moe_slots_up_to=8,batch_rows_up_to=8"; default none): issue 36's T table; "speculate" runs
#   `lily bench --synthetic --speculate K` at DEPTH for K in SPEC_K (default "1 2 3") with the
#   published acceptance forced (0.85, 0.67, 0.51) under the plan edit mtp=1: issue 37's 1.4x
# Sourcing it with PHASES="" only sets up the environment (LD_LIBRARY_PATH, /work/main).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[ -x .carry/lily ] || python3 -c "import tarfile; tarfile.open('.carry/carry.tar.xz').extractall('.')"
export LD_LIBRARY_PATH="$PWD/.carry/lib:${LD_LIBRARY_PATH:-}"
# The binaries were built in /work/main: fixtures and the embedded model are found there.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }

run_tests() {
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
  for t in .carry/tests/cuda_test_*; do
    echo "-- $t"; timeout ${TEST_TIMEOUT:-60} "$t" 2>&1 | grep -vE "^\[ RUN|^\[       OK" | head -n 400
    echo "exit ${PIPESTATUS[0]}"
  done > "$OUT/cuda_tests.txt" 2>&1
  grep -E "^-- |PASSED|FAILED \]|exit" "$OUT/cuda_tests.txt"
}

run_bench() {
  timeout ${BENCH_TIMEOUT:-120} .carry/lily bench --synthetic ${BENCH_ARGS:-} > "$OUT/bench.txt" 2>&1
  echo "bench exit $?" >> "$OUT/bench.txt"
  tail -n 20 "$OUT/bench.txt"
}

run_backend_tests() {
  for t in runtime_test_chat_service runtime_test_generate runtime_test_constrained_generate runtime_test_structured_output \
           e2e_test_lily_tiny; do
    echo "-- $t (LILY_TEST_BACKEND=cuda)"; LILY_TEST_BACKEND=cuda timeout ${TEST_TIMEOUT:-120} ".carry/tests/$t" 2>&1 |
      grep -vE "^\[ RUN|^\[       OK" | head -n 200
    echo "exit ${PIPESTATUS[0]}"
  done > "$OUT/backend_tests.txt" 2>&1
  grep -E "^-- |PASSED|FAILED \]|exit" "$OUT/backend_tests.txt"
}

run_parallel() {
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
  local dir; dir=$(mktemp -d)
  for t in .carry/tests/cuda_test_*; do
    (timeout ${TEST_TIMEOUT:-400} "$t" > "$dir/$(basename "$t").txt" 2>&1; echo "exit $?" >> "$dir/$(basename "$t").txt") &
  done
  for t in runtime_test_chat_service runtime_test_generate runtime_test_constrained_generate runtime_test_structured_output \
           e2e_test_lily_tiny; do
    (LILY_TEST_BACKEND=cuda timeout ${TEST_TIMEOUT:-400} ".carry/tests/$t" > "$dir/$t.txt" 2>&1
     echo "exit $?" >> "$dir/$t.txt") &
  done
  wait
  for f in "$dir"/*.txt; do echo "-- $(basename "$f" .txt)"; grep -vE "^\[ RUN|^\[       OK" "$f" | head -n 300; done \
    > "$OUT/tests.txt" 2>&1
  grep -E "^-- |PASSED|FAILED \]|^exit" "$OUT/tests.txt"
}

run_ab() {
  [ -x .carry-before/.carry-before/lily ] ||
    (cd .carry-before && python3 -c "import tarfile; tarfile.open('before.tar.xz').extractall('.')")
  for round in $(seq 1 ${AB_ROUNDS:-2}); do
    for side in before after; do
      local bin=.carry/lily
      [ $side = before ] && bin=.carry-before/.carry-before/lily
      echo "== $side (round $round)"
      timeout ${BENCH_TIMEOUT:-150} $bin bench --synthetic ${BENCH_ARGS:-} 2>&1 | grep -E "^\||copy bandwidth"
    done
  done > "$OUT/ab.txt" 2>&1
  cat "$OUT/ab.txt"
}

run_sanitize() {
  # Each entry: a test program, optionally ":gtest-filter" (e.g. cuda_test_deltanet:*Prefill*).
  for entry in ${SANITIZE:-cuda_test_norm cuda_test_deltanet cuda_test_attention cuda_test_gemv cuda_test_moe cuda_test_gemm_q4 cuda_test_moe_grouped}; do
    local t=${entry%%:*} filter=""
    [ "$t" != "$entry" ] && filter="--gtest_filter=${entry#*:}"
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
      echo "-- $tool $entry"
      timeout ${SANITIZE_TIMEOUT:-60} compute-sanitizer --tool $tool --error-exitcode 9 ".carry/tests/$t" $filter 2>&1 |
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" | tail -n 4
      echo "exit ${PIPESTATUS[0]}"
    done
  done > "$OUT/sanitizer.txt" 2>&1
  cat "$OUT/sanitizer.txt"
}

run_kernels() {
  timeout ${NCU_TIMEOUT:-150} ncu --profile-from-start off --clock-control none --graph-profiling node \
    --metrics gpu__time_duration.sum --csv .carry/lily bench --synthetic --prefill-lengths none \
    --decode-depths "${DEPTH:-4096}" --decode-tokens 2 --repeats 1 > "$OUT/ncu_decode.csv" 2>&1
  python3 tools/ncu_summary.py "$OUT/ncu_decode.csv" --steps 2 --templates | tee "$OUT/ncu_decode.txt" | head -20
}

run_timeline() {
  command -v nsys > /dev/null || { echo "timeline: nsys not found"; return; }
  timeout ${NSYS_TIMEOUT:-150} nsys profile --capture-range=cudaProfilerApi --cuda-graph-trace=node -f true \
    -o "$OUT/step" .carry/lily bench --synthetic --prefill-lengths none --decode-depths "${DEPTH:-4096}" \
    --decode-tokens 8 --repeats 1 > "$OUT/nsys.log" 2>&1
  nsys stats --report cuda_gpu_trace --format csv --output "$OUT/step" "$OUT/step.nsys-rep" >> "$OUT/nsys.log" 2>&1
  python3 tools/nsys_timeline.py "$OUT/step_cuda_gpu_trace.csv" --steps 8 | tee "$OUT/timeline.txt" | head -24
}

run_rows() {
  local plan=() e
  local rp=${ROWS_PLAN:-}
  for e in ${rp//,/ }; do plan+=(--kernel-plan "$e"); done
  for T in ${ROWS:-1 2 4 8}; do
    local kinds=("") ; [ "$T" -gt 1 ] && kinds=("--decode-rows $T" "--decode-rows $T --decode-batch")
    for k in "${kinds[@]}"; do
      echo "== rows $T ${k:-(one-row step)} plan ${ROWS_PLAN:-default}"
      timeout ${BENCH_TIMEOUT:-120} .carry/lily bench --synthetic --prefill-lengths none \
        --decode-depths "${DEPTH:-4096}" $k "${plan[@]}" 2>&1 | grep -E "^\||copy bandwidth|rror|ms/step"
    done
  done >> "$OUT/rows.txt" 2>&1
  grep -E "^==|^\| (decode|verify|batch)|rror" "$OUT/rows.txt"
}

run_speculate() {
  local rates=(0.85 0.67 0.51) K
  for K in ${SPEC_K:-1 2 3}; do
    local acc; acc=$(IFS=,; echo "${rates[*]:0:$K}")
    echo "== speculate $K, acceptance $acc"
    timeout ${BENCH_TIMEOUT:-120} .carry/lily bench --synthetic --prefill-lengths none --decode-depths "${DEPTH:-4096}" \
      --speculate "$K" --assume-acceptance "$acc" --kernel-plan mtp=1 2>&1 | tail -n 25
    echo "exit ${PIPESTATUS[0]}"
  done > "$OUT/speculate.txt" 2>&1
  cat "$OUT/speculate.txt"
}

for phase in ${PHASES-tests bench sanitize}; do
  case $phase in
    tests) run_tests ;;
    bench) run_bench ;;
    sanitize) run_sanitize ;;
    backend) run_backend_tests ;;
    parallel) run_parallel ;;
    ab) run_ab ;;
    kernels) run_kernels ;;
    timeline) run_timeline ;;
    rows) run_rows ;;
    speculate) run_speculate ;;
    *) echo "unknown phase $phase" ;;
  esac
done
