#!/usr/bin/env bash
# Runs the core test suites (no LibTorch) under AddressSanitizer + UndefinedBehaviorSanitizer, and
# the thread pool's and the kernels' thread-count determinism tests under ThreadSanitizer, each
# in its own build (CMakePresets.json: asan → build-asan/, tsan → build-tsan/; clang).
#   bash scripts/sanitize.sh [asan|tsan|all]      (default all)
# The suites run with PHASOR_TEST_SIZE=small: the tests that have a long-sequence case (T = 65,536
# and the like) take a shorter one, so that the instrumented run stays within minutes; every other
# case runs unchanged. Any sanitizer report fails the run (halt_on_error / abort_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-all}
bash scripts/install-deps.sh
jobs=$(nproc)
export PHASOR_TEST_SIZE=small
export PHASOR_SOURCE_DIR=$PWD

# The core suites: every GoogleTest program that does not link LibTorch (the CPU kernels,
# validation, the emulated GPU platform, the task data generators and plots, the test-support
# library) — except the six suites of CUDA kernels on the emulated GPU (<op>_gpu_test): under ASan
# each takes 10+ minutes (gla_gpu_test: 681 s here, every thread of every block a fiber switched
# through ucontext), which the CI budget cannot hold; they run in the Release suite, and the
# emulated GPU itself (simt_test, device_test) runs here.
# The longest under ASan first (FoX ~85 s, GLA 35, Gated DeltaNet 25, soak 13, FAVOR+ 11), so that
# the two programs at a time finish together.
core_tests=(forgetting_attn_test gla_test gated_delta_rule_test soak_test favor_test common_test
            dtype_test validate_test rotary_test grape_test short_conv_test
            string_rotation_test structured_rotation_test tasks_data_test
            tasks_files_test tasks_plot_test simt_test device_test testing_support_test)

if [[ $which == asan || $which == all ]]; then
  echo "== ASan + UBSan: core suites"
  t0=$(date +%s)
  bash scripts/configure-preset.sh asan
  cmake --build --preset asan -j "$jobs" --target "${core_tests[@]}"
  t1=$(date +%s)
  # Each program runs whole (its tests in one process), $jobs programs at a time; a failure is
  # reported when it happens and fails the script once every program has run.
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
  mkdir -p build-asan/sanitize-logs
  printf '%s\n' "${core_tests[@]}" | xargs -P "$jobs" -I{} bash -c '
    log=build-asan/sanitize-logs/{}.log; s=$(date +%s)
    if build-asan/tests/{} >"$log" 2>&1; then
      echo "asan: {}: $(grep -E "^\[  PASSED  \]" "$log" | sed "s/\[  PASSED  \] //") in $(( $(date +%s) - s )) s"
    else
      tail -n 40 "$log"; echo "asan: {} FAILED (log: $log)" >&2; exit 1
    fi'
  t2=$(date +%s)
  echo "asan: build $((t1 - t0)) s, tests $((t2 - t1)) s"
fi

if [[ $which == tsan || $which == all ]]; then
  echo "== TSan: thread pool and thread-count determinism"
  t0=$(date +%s)
  bash scripts/configure-preset.sh tsan
  tsan_tests=(common_test gla_test gated_delta_rule_test forgetting_attn_test rotary_test
              grape_test short_conv_test favor_test structured_rotation_test)
  cmake --build --preset tsan -j "$jobs" --target "${tsan_tests[@]}"
  t1=$(date +%s)
  # The thread pool's own tests, and every test that compares runs on different thread counts
  # or schedules (these run the pool with 1 to 8 workers over the same data).
  filter='Threads*:*ThreadCount*:*ThreadInvariance*:*AcrossThreadCounts*:*ParallelSchedule*:*BlockParallel*:*DeterministicForAnyThreadCount*:*InPlace*'
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  for t in "${tsan_tests[@]}"; do
    out=$(build-tsan/tests/$t --gtest_filter="$filter" 2>&1) || { echo "$out" | tail -n 60; echo "tsan: $t failed" >&2; exit 1; }
    echo "tsan: $t: $(echo "$out" | grep -E '^\[  PASSED  \]' | sed 's/\[  PASSED  \] //')"
    if ! echo "$out" | grep -qE '^\[  PASSED  \] [1-9]'; then
      echo "tsan: $t ran no test under the filter" >&2; exit 1
    fi
  done
  t2=$(date +%s)
  echo "tsan: build $((t1 - t0)) s, tests $((t2 - t1)) s"
fi
