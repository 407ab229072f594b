#!/usr/bin/env bash
# phasor vs ggml on the CPU, side by side (issue 13).
#
#   bash bench/ggml-compare.sh /path/to/ggml [--processes 6] [--build-dir DIR] [--threads 2]
#                              [--min-time 1] [--jobs 2]
#
# Builds bench/ggml/ggml_compare (Release) against the ggml checkout given (never vendored: any
# clone of github.com/ggml-org/ggml), checks that phasor and ggml compute the same function on
# the same inputs (the program's `check`: fails loudly otherwise), then runs one measurement per
# process, phasor and ggml interleaved shape by shape, the whole list --processes times (every
# other round in reverse order, so that a drift of the machine's speed hits both libraries
# alike), and prints the markdown table of medians, ratios and goals (bench/ggml/table.py).
# float32, B = 1, H = 8, K = V = 128; the forwards at T = 1024, 4096, 16384 on --threads threads;
# decoding one token on 1 and 2 threads; forward + backward at T = 4096.
# The raw JSON lines are kept in <build dir>/ggml-compare.jsonl.
set -euo pipefail

usage() {
  sed -n '4,6p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

[[ $# -ge 1 ]] || usage
ggml_dir=$1
shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
processes=6
build_dir="$repo/build-ggml"
threads=2
min_time=1
jobs=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --processes) processes=$2; shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --min-time) min_time=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "ggml-compare.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
if [[ ! -f "$ggml_dir/include/ggml.h" ]]; then
  echo "ggml-compare.sh: '$ggml_dir' is not a ggml checkout (no include/ggml.h)" >&2
  exit 2
fi
ggml_dir=$(cd "$ggml_dir" && pwd)

echo "== building ggml_compare in $build_dir (ggml: $ggml_dir)" >&2
mkdir -p "$build_dir"
cmake -S "$repo/bench/ggml" -B "$build_dir" -DGGML_SOURCE_DIR="$ggml_dir" \
  -DCMAKE_BUILD_TYPE=Release >"$build_dir/configure.log" 2>&1 ||
  { cat "$build_dir/configure.log" >&2; exit 1; }
cmake --build "$build_dir" --target ggml_compare -j"$jobs" >&2
program="$build_dir/ggml_compare"
[[ -x $program ]] || program=$(find "$build_dir" -name ggml_compare -type f -perm -u+x | head -1)

results="$build_dir/ggml-compare.jsonl"
checks="$build_dir/ggml-compare-check.jsonl"

echo "== checking that phasor and ggml compute the same function" >&2
if ! "$program" check --T 1024 --threads "$threads" >"$checks"; then
  cat "$checks" >&2
  echo "ggml-compare.sh: FAILED: phasor's and ggml's outputs disagree; no benchmark run" >&2
  exit 1
fi

# The measurement list of one round: per shape, the libraries alternate.
measurements=()
for T in 1024 4096 16384; do
  for op in gla gdn; do
    measurements+=("--library phasor --op $op --impl chunk --T $T --threads $threads"
      "--library ggml --op $op --T $T --threads $threads"
      "--library phasor --op $op --impl recurrent --T $T --threads $threads")
  done
  measurements+=("--library phasor --op fox --impl chunk --T $T --threads $threads"
    "--library ggml --op fox --T $T --threads $threads")
done
for decode_threads in 1 2; do
  for op in gla gdn; do
    measurements+=("--library phasor --op $op --mode decode --T 1 --threads $decode_threads"
      "--library ggml --op $op --mode decode --T 1 --threads $decode_threads")
  done
done
for op in gla gdn fox; do
  measurements+=("--library phasor --op $op --impl chunk --mode fwd_bwd --T 4096 --threads $threads")
done

: >"$results"
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
count=${#measurements[@]}
for ((round = 1; round <= processes; ++round)); do
  echo "== round $round of $processes ($count processes)" >&2
  for ((i = 0; i < count; ++i)); do
    index=$i
    ((round % 2 == 0)) && index=$((count - 1 - i))
    # shellcheck disable=SC2086  # the arguments are split on purpose
    "$program" measure ${measurements[$index]} --min-time "$min_time" | tee -a "$results" >&2
  done
done

python3 "$repo/bench/ggml/table.py" "$results" "$checks" --processes "$processes" \
  --threads "$threads"
# Other work on the machine slows multi-threaded calls most (a thread waiting at a barrier for a
# descheduled peer): the load average says how much to trust the figures.
echo
echo "Load average (1, 5, 15 min) before the measurements: $load_before; after:" \
  "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown); $(nproc) cores."
