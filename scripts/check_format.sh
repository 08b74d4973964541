#!/usr/bin/env bash
# Fails when a C++ or CUDA source differs from what .clang-format makes of it (the files of
# scripts/format.sh). scripts/test.sh runs it before building.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/format_sources.sh
command -v clang-format >/dev/null || { echo "check_format: clang-format is not installed (scripts/setup.sh)" >&2; exit 1; }
mapfile -t differ < <(format_sources |
  xargs -0 -r -P "$(nproc)" -I{} sh -c 'clang-format --dry-run --Werror "$1" >/dev/null 2>&1 || echo "$1"' _ {} | sort)
if ((${#differ[@]})); then
  echo "check_format: ${#differ[@]} files differ from .clang-format:" >&2
  printf '  %s\n' "${differ[@]}" >&2
  echo "Fix: scripts/format.sh (then review and commit the changes)" >&2
  exit 1
fi
echo "check_format: $(format_sources | tr -cd '\0' | wc -c) files formatted as .clang-format says"
