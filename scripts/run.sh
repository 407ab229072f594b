#!/usr/bin/env bash
# The main job: install, build, then run the synthetic-task suite (default: the quick suite,
# tasks/configs/quick, about 20 minutes on 2 cores). Each config trains and evaluates its grid and
# writes results.json, results.csv and PNG plots into results/<suite>/<config name>/.
#   bash scripts/run.sh            # quick suite
#   bash scripts/run.sh full       # the full suite (hours; see README)
#   bash scripts/run.sh demo ...   # every op through every implementation (phasor demo)
# Interrupted runs continue where they stopped when the same command is run again (--resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
suite=${1:-quick}
if [[ $suite == demo ]]; then
  shift
  exec ./build/phasor demo "$@"
fi
if [[ ! -d tasks/configs/$suite ]]; then
  echo "scripts/run.sh: unknown suite '$suite' (expected quick, full or demo)" >&2
  exit 2
fi
start=$(date +%s)
for config in tasks/configs/"$suite"/*.json; do
  name=$(basename "$config" .json)
  echo "== $suite/$name"
  ./build/phasor tasks run "$config" --out "results/$suite/$name" --resume
done
echo "== $suite suite finished in $(($(date +%s) - start)) s; results in results/$suite/"
