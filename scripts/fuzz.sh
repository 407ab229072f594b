#!/usr/bin/env bash
# Coverage-guided fuzzing of phasor's parsers and argument validation (tests/fuzz/, libFuzzer
# under ASan + UBSan).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]      (default 60)
#   FUZZ_TARGETS="op_args_fuzz" scripts/fuzz.sh 300     (a subset)
#
# Configures and builds build-asan/ (clang, -fsanitize=address,undefined, libFuzzer's coverage
# instrumentation everywhere) when needed, then:
#   1. replays every target's committed inputs, one target at a time — tests/fuzz/corpus/<target>/
#      and tests/fuzz/regressions/<target>/ — once each: any failure stops the script;
#   2. fuzzes every target for SECONDS_PER_TARGET, as many targets at a time as there are cores
#      (each run is one process), with -rss_limit_mb=4096 (also the limit of any one allocation)
#      and -timeout=25, starting from those inputs and writing new interesting ones to
#      build-asan/fuzz-out/<target>/corpus/ (never to the committed corpus); a crash lands in
#      build-asan/fuzz-out/<target>/ as crash-<sha1> (or leak-, timeout-, oom-).
# Prints per target the executions, executions per second, coverage (libFuzzer's cov: edges and
# ft: features), new inputs and crashes; exits non-zero if any target crashed.
# A crash input, once fixed, belongs in tests/fuzz/regressions/<target>/ (replayed by step 1 and
# by the fuzz build's ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET ≥ 1] (got '$seconds')" >&2
  exit 2
fi
all_targets=(op_args_fuzz op_inputs_fuzz task_config_fuzz checkpoint_fuzz)
read -r -a targets <<<"${FUZZ_TARGETS:-${all_targets[*]}}"

bash scripts/install-deps.sh
# The asan preset's build (build-asan/, shared with scripts/sanitize.sh): clang, ASan + UBSan,
# libFuzzer's coverage instrumentation everywhere (-fsanitize=fuzzer-no-link), _GLIBCXX_ASSERTIONS
# (bounds-checked std::array / std::vector operator[] in the library too), no CUDA backend,
# ucontext fibers, PHASOR_BUILD_FUZZERS=ON.
build=build-asan
bash scripts/configure-preset.sh asan
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

# Sanitizers as in the asan preset's tests: stop at the first report, with a stack. libFuzzer
# checks each input for leaks; an allocation above -rss_limit_mb is reported as out-of-memory.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
out=$build/fuzz-out
# The crash, leak, timeout and out-of-memory inputs libFuzzer has written to a folder.
artifacts() { find "$1" -maxdepth 1 -type f -regex '.*/\(crash\|leak\|timeout\|oom\)-.*' | wc -l; }
# inputs=(the target's committed inputs): its corpus, and its regressions when it has some.
committed_inputs() {
  inputs=(tests/fuzz/corpus/"$1")
  [[ -d tests/fuzz/regressions/$1 ]] && inputs+=(tests/fuzz/regressions/"$1")
  return 0
}

# Each target's fuzzing run (one process, one core): its summary line in $out/<target>/summary,
# and the start of its report on stderr when it crashed; exit status 1 then.
fuzz_one() {
  local target=$1 bin=$build/tests/fuzz/$1 status=0 before runs rate new cov crashes
  local inputs dict=() log=$out/$target/fuzz.log
  committed_inputs "$target"
  [[ -f tests/fuzz/$target.dict ]] && dict=(-dict="tests/fuzz/$target.dict")
  before=$(artifacts "$out/$target")
  "$bin" "$out/$target/corpus" "${inputs[@]}" "${dict[@]}" -max_total_time="$seconds" \
    -rss_limit_mb=4096 -timeout=25 -print_final_stats=1 -artifact_prefix="$out/$target/" \
    >"$log" 2>&1 || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  new=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
  crashes=$(($(artifacts "$out/$target") - before))
  if ((status != 0)); then
    crashes=$((crashes > 0 ? crashes : 1))
    { grep -m1 -A30 -E 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer)|runtime error|_fuzz: ' \
        "$log" || tail -40 "$log"; echo "$target: CRASH (log: $log)"; } >&2
  fi
  printf '%-17s %10s execs %8s exec/s  %-22s %6s new  %s crashes\n' "$target" "${runs:-?}" \
    "${rate:-?}" "${cov:-cov: ?}" "${new:-?}" "$crashes" >"$out/$target/summary"
  return $((status != 0))
}

# 1. Every target's committed inputs, one at a time (seconds in all): any failure stops here.
for target in "${targets[@]}"; do
  committed_inputs "$target"
  mkdir -p "$out/$target/corpus"
  rm -f "$out/$target/summary"
  echo "== $target: replaying ${inputs[*]}"
  "$build/tests/fuzz/$target" -runs=0 -rss_limit_mb=4096 -timeout=25 "${inputs[@]}" \
    >"$out/$target/replay.log" 2>&1 || {
    tail -40 "$out/$target/replay.log" >&2
    echo "$target: a committed input fails (log: $out/$target/replay.log)" >&2
    exit 1
  }
done

# 2. Fuzzing, as many targets at a time as there are cores: each libFuzzer run is one process on
# one core, so every target still gets SECONDS of a core, and the stage takes
# ceil(targets / cores) × SECONDS instead of targets × SECONDS.
jobs=$(nproc)
failed=0
running=0
for target in "${targets[@]}"; do
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  echo "== $target: fuzzing for ${seconds}s"
  fuzz_one "$target" &
  running=$((running + 1))
done
while ((running > 0)); do
  wait -n || failed=1
  running=$((running - 1))
done
echo "== fuzzing summary (${seconds}s per target, up to $jobs at a time)"
for target in "${targets[@]}"; do cat "$out/$target/summary"; done
exit $failed
