#!/usr/bin/env bash
# Builds lily with CUDA for the GPU machine and packs what a run there needs into
# .carry/carry.tar.xz (name `.carry` in the device call's carry list): the lily binary, the
# CUDA test binaries (stripped), and the shared libraries the GPU machine's image lacks (it has
# the CUDA toolkit but not Debian's fmt, PCRE2 and utf8proc).
# The working tree that travels is limited to 64 MiB, hence the compression.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-cuda}  # BUILD_DIR: another build folder (e.g. while someone else builds in build-cuda)
# CUDA_ARCHS: the device machines are Hopper, so 90a alone unless told (the default build's five
# architectures take five times as long to compile on this 2-core machine).
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
cmake -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=ON -DLILY_NATIVE=OFF -DLILY_BENCH=OFF \
  -DLILY_KERNEL_BENCHES=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a-real}" "${launcher[@]}" >/dev/null
# Only what travels: lily, the CUDA tests, the kernel benches, the runtime tests below (a cold
# build of everything else, the CPU tests and benchmarks, would double the time on 2 cores).
runtime_tests=(runtime_test_chat_service runtime_test_generate runtime_test_constrained_generate
               runtime_test_structured_output e2e_test_lily_tiny)
mapfile -t packed < <(ninja -C $build -t targets all | grep -oE '^(cuda_test_[a-z0-9_]+|bench_[a-z0-9_]+): phony' |
                      cut -d: -f1)
cmake --build $build -j "$(nproc)" --target lily "${runtime_tests[@]}" "${packed[@]}"
stage=$(mktemp -d)
mkdir -p "$stage/.carry/lib" "$stage/.carry/tests"
cp $build/lily "$stage/.carry/"
find $build/tests/cuda -maxdepth 1 -type f -executable -name 'cuda_test_*' -exec cp {} "$stage/.carry/tests/" \;
# The kernel workbench programs (bench/kernels/*: run .carry/bench/bench_* on the GPU machine).
mkdir -p "$stage/.carry/bench"
find $build/bench/kernels -type f -executable -name 'bench_*' -exec cp {} "$stage/.carry/bench/" \;
strip "$stage"/.carry/bench/*
# Tests of the runtime that take LILY_TEST_BACKEND=cuda (session reuse, lily-tiny end to end).
for t in "${runtime_tests[@]}"; do cp $build/tests/*/$t "$stage/.carry/tests/"; done
strip "$stage/.carry/lily" "$stage"/.carry/tests/*
for lib in $(ldd $build/lily | awk '/=> \// {print $3}' |
             grep -E 'libfmt|libpcre2|libutf8proc'); do
  cp -L "$lib" "$stage/.carry/lib/"
done
rm -rf .carry && mkdir -p .carry
# xz -9: its 64 MiB window holds several binaries, and they share most of their bytes (the
# kernels each one links): 9 MB instead of 49 at the default level (2026-12-03).
tar -C "$stage" -cf - .carry | xz -9 -T1 > .carry/carry.tar.xz
rm -rf "$stage"
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
ls -la .carry/carry.tar.xz
