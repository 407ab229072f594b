#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into one archive, for a GPU machine that has the NVIDIA
# driver but not this machine's libraries (the device tool's H200 machines run Ubuntu 24.04 with
# neither Boost nor Google Benchmark): the programs of scripts/gpu-programs.sh from a build with the
# CUDA backend, stripped, under tests/ and bench/, and in lib/ every shared library they load from
# outside the C and C++ runtimes (libboost_context, libbenchmark). gpu-check.sh puts lib/ on
# LD_LIBRARY_PATH. CUDA's runtime is linked statically; the programs need the machine's driver
# only, and a C library no older than the one they were built against (Debian 12: glibc 2.36, of
# which they use symbols up to 2.34).
#
#   bash scripts/gpu-package.sh [BUILD_DIR [ARCHIVE]]    # defaults: build-gpu, BUILD_DIR/gpu-package.tar.xz
#
# Then, on the GPU machine, in a checkout of the same commit (the tests read its data files):
#   mkdir -p /tmp/b && tar -xJf ARCHIVE -C /tmp/b && bash scripts/gpu-check.sh /tmp/b /tmp/b/gpu-check
# BUILD_DIR: configured with the GPU's architecture and for any x86-64 host, e.g.
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DPHASOR_NATIVE=OFF
#   cmake --build build-gpu -j"$(nproc)" --target <the programs of scripts/gpu-programs.sh>
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/scripts/gpu-programs.sh"
build=${1:-build-gpu}
archive=${2:-$build/gpu-package.tar.xz}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/tests" "$stage/bench" "$stage/lib"
programs=()
for t in "${gpu_test_programs[@]}"; do programs+=("tests/$t"); done
for b in "${gpu_bench_programs[@]}"; do programs+=("bench/$b"); done
for p in "${programs[@]}"; do
  [[ -x $build/$p ]] || { echo "gpu-package: $build/$p is missing (build it first)" >&2; exit 1; }
  cp "$build/$p" "$stage/$p"
  strip "$stage/$p"
  # Shared libraries outside the C / C++ runtimes, which every Linux machine has.
  while read -r lib; do
    cp -L "$lib" "$stage/lib/"
  done < <(ldd "$build/$p" | awk '$3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' || true)
done
tar -cJf "$archive" -C "$stage" .
echo "gpu-package: $archive ($(du -h "$archive" | cut -f1)): ${#programs[@]} programs, lib/: $(ls "$stage/lib" | paste -sd' ')"
