#!/usr/bin/env bash
# The main job: install, build, then run every op through every implementation (agreement with
# the float64 reference and timing). Arguments go to `phasor demo` (see `build/phasor demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/phasor demo "$@"
