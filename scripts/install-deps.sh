#!/usr/bin/env bash
# Installs what phasor needs from Debian's packages (idempotent: does nothing when all are there).
set -euo pipefail
packages=(
  cmake g++ make git
  libeigen3-dev          # CPU dense math
  libboost-context-dev   # fibers of the emulated GPU (cuda/simt)
  libtorch-dev           # LibTorch layer, the phasor command, the task harness
  libgloo-dev            # headers of c10d's Gloo process group (phasor/distributed.h)
  # LibTorch's matrix products go through libblas.so.3, which is Debian's reference (netlib)
  # BLAS unless an optimised one is installed: OpenBLAS (OpenMP build, like LibTorch's own
  # threads) takes over the alternative and makes nn::Linear ~30x faster here (2.4 → 82 GFLOP/s
  # for a 2048×512 · 512×256 product on 2 cores).
  libopenblas0-openmp
  python3-torch          # .pt interchange checks (tests/cli_roundtrip_test.py)
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev
  libcairo2-dev          # PNG plots of the task harness (tasks/src/plot.cpp)
  zlib1g-dev             # CRC-32 checksums of the task harness's checkpoints (tasks/src/train.cpp)
  clang-format
  # The sanitizer and fuzzing builds (CMakePresets.json asan / tsan, scripts/sanitize.sh,
  # scripts/fuzz.sh): clang with its sanitizer runtimes and libFuzzer.
  clang libclang-rt-dev
  ninja-build            # the sanitizer presets' generator: their several targets build in parallel
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "phasor: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
