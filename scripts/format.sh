#!/usr/bin/env bash
# Applies .clang-format to every C++ and CUDA source we own: the tracked *.h *.hpp *.cpp *.cc
# *.cu *.cuh under src/ tests/ bench/ tools/ (git ls-files: untracked files are left alone;
# fixtures and node_modules are not ours). scripts/check_format.sh checks the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/format_sources.sh
format_sources | xargs -0 -r -P "$(nproc)" -n 16 clang-format -i
echo "format: clang-format applied to $(format_sources | tr -cd '\0' | wc -c) files"
