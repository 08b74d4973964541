#!/usr/bin/env bash
# Installs every build and test dependency of lily from Debian 12 packages.
# Idempotent; run as root (or with sudo) on a fresh machine.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  clang-format            # scripts/check_format.sh (.clang-format is written for clang-format 14)
  clang libclang-rt-14-dev  # libFuzzer and the sanitizers' runtime for the fuzz phase (tests/fuzz)
  nlohmann-json3-dev      # JSON: config.json, safetensors headers, the HTTP API
  libboost-dev            # Boost.Beast / Asio (header-only): the HTTP transport of `lily serve`
  libpcre2-dev            # tokenizer pre-split regex with Unicode properties
  libutf8proc-dev         # NFC normalization
  libcli11-dev            # command line
  libfmt-dev              # formatting
  libgtest-dev libgmock-dev libbenchmark-dev
  nodejs npm              # the OpenAI client tests of the server
  chromium                # the chat page test: a real browser, headless (tests/server/run_browser_test.sh)
  curl
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come with the machine image rather than from Debian: accept any working `node`.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || filtered+=("$p"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all dependencies present"
