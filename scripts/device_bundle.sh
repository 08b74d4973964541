#!/usr/bin/env bash
# Builds lily with CUDA for the GPU machine and gathers what a run there needs into .carry/:
# the lily binary, the test binaries, and the shared libraries the GPU machine's image lacks
# (it has the CUDA toolkit but not Debian's fmt, PCRE2 and utf8proc).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-cuda
cmake -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLILY_CUDA=ON -DLILY_NATIVE=OFF -DLILY_BENCH=OFF >/dev/null
cmake --build $build -j "$(nproc)"
rm -rf .carry && mkdir -p .carry/lib .carry/tests
cp $build/lily .carry/
find $build/tests -maxdepth 2 -type f -executable -name '*test*' -exec cp {} .carry/tests/ \;
for lib in $(ldd $build/lily | awk '/=> \// {print $3}' | grep -E 'libfmt|libpcre2|libutf8proc'); do cp "$lib" .carry/lib/; done
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >> .git/info/exclude
du -sh .carry
