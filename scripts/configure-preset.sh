#!/usr/bin/env bash
# Configures one of the sanitizer presets (cmake --preset asan|tsan, build folder build-NAME). A
# folder configured earlier with another generator (these presets built with Makefiles before
# 2026-11-28, Ninja since) is started afresh: CMake refuses to switch generators in place.
#   bash scripts/configure-preset.sh asan|tsan
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/configure-preset.sh asan|tsan}
if ! log=$(cmake --preset "$name" 2>&1); then
  if [[ $log != *"Does not match the generator used previously"* ]]; then
    echo "$log" >&2
    exit 1
  fi
  echo "configure-preset: build-$name was configured with another generator: removing it and" \
    "configuring afresh"
  rm -rf "build-$name"
  cmake --preset "$name" >/dev/null
fi
