#!/usr/bin/env bash
# Configures, builds and runs examples/ against a phasor installed under PREFIX
# (after `cmake --install <build dir> --prefix PREFIX`).
#   usage: bash examples/build_and_run.sh PREFIX [BUILD_DIR]
# BUILD_DIR defaults to a temporary directory, removed afterwards.
set -euo pipefail
if (($# < 1)); then
  echo "usage: $0 PREFIX [BUILD_DIR]" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
if (($# >= 2)); then
  build=$2
else
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
fi
cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
"$build/gla_layer"
"$build/task_harness"
