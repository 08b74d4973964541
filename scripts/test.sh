#!/usr/bin/env bash
# Builds lily and runs every test that this machine can run (GPU tests skip without a GPU).
# This is the README's test command and what CI runs (.ci/run). The phases, in order, each timed:
#   setup           scripts/setup.sh
#   format          scripts/check_format.sh: the C++/CUDA sources as .clang-format says (fix: scripts/format.sh)
#   build, test     build/ with warnings as errors (LILY_WERROR=ON; CUDA when nvcc is found); ctest
#                   (the server's end-to-end scripts left to the sanitized run)
#   sanitize-build, sanitize-test
#                   build-sanitize/: the CPU code and its tests under AddressSanitizer (leaks
#                   included) and UndefinedBehaviorSanitizer, no CUDA, no benchmarks; ctest. Any
#                   report fails the test that ran into it; the server tests run the sanitized `lily serve`.
#   fuzz-build, fuzz
#                   build-fuzz/: the libFuzzer harnesses of tests/fuzz (clang, ASan + UBSan), then
#                   each for LILY_FUZZ_SECONDS (default 30) from its committed seed corpus
#                   (tests/fuzz/run.sh; a finding fails the phase). docs/fuzzing.md: the long runs.
# Arguments go to both ctest runs (scripts/test.sh -R tokenizer). LILY_BUILD_DIR and
# LILY_SANITIZE_BUILD_DIR name other build folders; LILY_CMAKE_ARGS adds cmake arguments to the
# main build (-DLILY_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

times=()
phase() {  # phase NAME COMMAND...: runs the command, prints and keeps how long it took
  local name=$1 t0=$SECONDS
  shift
  echo "== $name"
  "$@"
  times+=("$(printf '  %-15s %5d s' "$name" $((SECONDS - t0)))")
  echo "== $name: $((SECONDS - t0)) s"
}

build_dir=${LILY_BUILD_DIR:-build}
build() {
  cmake -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_WERROR=ON ${LILY_CMAKE_ARGS:-} >/dev/null
  cmake --build "$build_dir" -j "$(nproc)"
}

# The sanitized build compiles at -Og, the CPU forward's loops at -O3 (CMakeLists.txt). It has no
# -Werror: the main build holds the warnings, and g++'s warnings move with the instrumentation
# (at -O3 it warned falsely inside std::regex).
# Left out of it, the tests that repeat code the sanitized tests run anyway, many times over
# (each runs in the plain build; times under ASan and UBSan on the 2-core machine, 2026-12-07):
#   LilyTiny.HeldOutArithmeticWithThinking  lily-tiny's accuracy on 40 held-out questions: the
#       forward, chat service and parser of HeldOutToolCallsAreExact, ThinkingOn/Off, the
#       ChatService and server tests, 40 times over (390 s; 32 s in the plain build)
#   JsonSchemaGrammar.RandomSchemasAgreeWithTheReference  120 random schemas against the
#       reference matcher (106 s): the request fuzzer compiles schemas under the sanitizers
#   SpeculativeSampling.FirstTokensKeepPlainSamplingsDistribution  a distribution test, thousands
#       of draws of the Speculative* tests' loop (97 s)
#   LilyTinyMtp.FirstDraftAcceptanceOnHeldOutPrompts  the MTP head's acceptance, the forward of
#       the other LilyTinyMtp tests over every held-out prompt (31 s)
# The server's end-to-end scripts (node clients, curl, the soak, the browser page: ~90 s, one at a
# time on the server port) run once, in the sanitized build against the sanitized `lily serve`:
# the same code, with every memory error, leak and undefined behaviour reported.
server_e2e='^server_(node|curl|browser)_'
sanitize_left_out='^(LilyTiny\.HeldOutArithmeticWithThinking|JsonSchemaGrammar\.RandomSchemasAgreeWithTheReference|SpeculativeSampling\.FirstTokensKeepPlainSamplingsDistribution|LilyTinyMtp\.FirstDraftAcceptanceOnHeldOutPrompts)$'
sanitize_dir=${LILY_SANITIZE_BUILD_DIR:-build-sanitize}
sanitize_build() {
  cmake -B "$sanitize_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=OFF -DLILY_BENCH=OFF \
    -DLILY_SANITIZE=address,undefined >/dev/null
  cmake --build "$sanitize_dir" -j "$(nproc)"
}
sanitize_test() {
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    ctest --test-dir "$sanitize_dir" --output-on-failure -j "$(nproc)" \
    -E "$sanitize_left_out" "$@"
}

# The fuzzers link only what they test (model, tokenizer, chat, and the server's and runtime's
# files that read a request): no backend, no HTTP transport, so this build stays small.
fuzz_dir=${LILY_FUZZ_BUILD_DIR:-build-fuzz}
fuzz_build() {
  if ! command -v clang++ >/dev/null; then
    echo "fuzz-build: clang++ not found; the fuzzers need the Debian packages clang and libclang-rt-14-dev" >&2
    return 1
  fi
  CC=clang CXX=clang++ cmake -B "$fuzz_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=OFF -DLILY_BENCH=OFF \
    -DLILY_TESTS=OFF -DLILY_FUZZ=ON -DLILY_SANITIZE=address,undefined >/dev/null
  cmake --build "$fuzz_dir" -j "$(nproc)" --target lily_fuzzers
}

phase setup bash scripts/setup.sh
phase format bash scripts/check_format.sh
phase build build
phase test ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -E "$server_e2e" "$@"
phase sanitize-build sanitize_build
phase sanitize-test sanitize_test "$@"
phase fuzz-build fuzz_build
phase fuzz bash tests/fuzz/run.sh "$fuzz_dir" "${LILY_FUZZ_SECONDS:-30}"
printf '%s\n' "== times" "${times[@]}"
