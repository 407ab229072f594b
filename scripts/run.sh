#!/usr/bin/env bash
# The main job: install, build, then run the synthetic-task suite (default: the quick suite,
# tasks/configs/quick, about 13 minutes on 2 cores). Each config trains and evaluates its grid and
# writes results.json, results.csv and PNG plots into results/<suite>/<config name>/.
#   bash scripts/run.sh                  # quick suite
#   bash scripts/run.sh full --jobs 2    # the full suite (1 h 37 min on 2 cores; see README)
#   bash scripts/run.sh diagnostics      # the MQAR diagnostic runs (tasks/configs/diagnostics)
#   bash scripts/run.sh demo ...         # every op through every implementation (phasor demo)
# --jobs N runs N configs at a time, each on one thread, its output in results/<suite>/<name>/log.txt
# (small models train faster as separate single-threaded processes than as one process on two
# threads). Interrupted runs continue where they stopped when the same command is run again
# (--resume).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=${1:-quick}
if [[ $suite == demo ]]; then
  shift
  bash scripts/build.sh
  exec ./build/phasor demo "$@"
fi
jobs=1
if (($# >= 2)); then
  if [[ $2 != --jobs || $# != 3 || ! $3 =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: scripts/run.sh [quick|full] [--jobs N] | scripts/run.sh demo [args]" >&2
    exit 2
  fi
  jobs=$3
fi
if [[ ! -d tasks/configs/$suite ]]; then
  echo "scripts/run.sh: unknown suite '$suite' (expected quick, full or demo)" >&2
  exit 2
fi
bash scripts/build.sh
start=$(date +%s)
run_config() {  # config path; prints the config's table when it finishes
  local config=$1 name
  name=$(basename "$config" .json)
  if ((jobs == 1)); then
    echo "== $suite/$name"
    ./build/phasor tasks run "$config" --out "results/$suite/$name" --resume
  else
    mkdir -p "results/$suite/$name"
    echo "== $suite/$name: started (log: results/$suite/$name/log.txt)"
    if ./build/phasor tasks run "$config" --out "results/$suite/$name" --resume --threads 1 \
      >"results/$suite/$name/log.txt" 2>&1; then
      echo "== $suite/$name"
      sed -n '/sequence accuracy at the best lr/,$p' "results/$suite/$name/log.txt"
    else
      echo "== $suite/$name FAILED: see results/$suite/$name/log.txt" >&2
      return 1
    fi
  fi
}
export -f run_config
export suite jobs
# The configs in name order, `jobs` at a time.
printf '%s\n' tasks/configs/"$suite"/*.json | xargs -P "$jobs" -I{} bash -c 'run_config "$@"' _ {}
echo "== $suite suite finished in $(($(date +%s) - start)) s; results in results/$suite/"
