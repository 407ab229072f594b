#!/usr/bin/env bash
# On a machine with a CUDA GPU: the checks that need one, in one pass, each with its own time cap.
#   1. the Device::cuda instances of every GPU suite (tests/*_gpu_test, simt_test, device_test,
#      validate_test), with the CPU-vs-GPU error records they print;
#   2. the device benchmarks at fla's shapes (BM_*Device rows with device:1, CUDA events);
#   3. fla's kernels at the same shapes, when PHASOR_FLA_DIR names an fla checkout;
#   4. compute-sanitizer, when it is installed: memcheck over the chunk suites' CUDA instances,
#      each run capped at PHASOR_SANITIZE_SECONDS (default 30); racecheck over one chunk test of
#      each suite (scripts/gpu-programs.sh), capped at PHASOR_RACECHECK_SECONDS (default 150).
# Every log goes into OUT_DIR; a summary table is printed last.
#
#   bash scripts/gpu-check.sh [BUILD_DIR [OUT_DIR]]    # defaults: build, build/gpu-check
#
# BUILD_DIR is a build tree configured with the CUDA backend for this GPU's architecture
# (CMAKE_CUDA_ARCHITECTURES=90 for an H100/H200), or the unpacked archive of
# scripts/gpu-package.sh (its programs, and in lib/ the shared libraries they need, put on
# LD_LIBRARY_PATH here).
# Environment: PHASOR_GPU_CHECK_STEPS (default "tests bench fla sanitize") picks the steps;
# PHASOR_FLA_DIR, an fla checkout: fla's kernels timed at the same shapes (bench/fla_compare.py).
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
out=${2:-$build/gpu-check}
steps=${PHASOR_GPU_CHECK_STEPS:-tests bench fla sanitize}
source "$repo/scripts/gpu-programs.sh"
mkdir -p "$out"
[[ -d $build/lib ]] && export LD_LIBRARY_PATH=$build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHASOR_SOURCE_DIR=${PHASOR_SOURCE_DIR:-$repo}
cuda_only='-*/emulated'  # the op suites' CUDA instances (and their non-parametrised tests)
summary=()
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv \
  | tee "$out/gpu.txt"

if [[ " $steps " == *" tests "* ]]; then
  # The op suites' emulated instances are CI's business (they take minutes); here only the
  # CUDA ones, plus the platform suites whole (they are small and compare both backends).
  for t in "${gpu_test_programs[@]}"; do
    bin=$build/tests/$t
    [[ -x $bin ]] || { note "$t: MISSING"; continue; }
    filter='*'
    [[ $t == *_gpu_test ]] && filter=$cuda_only
    t0=$(date +%s%N)
    timeout 300 "$bin" --gtest_filter="$filter" --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    ms=$((($(date +%s%N) - t0) / 1000000))
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out/$t.log")
    failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out/$t.log")
    skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out/$t.log")
    note "$t: rc $rc, ${passed:-0} passed, ${failed:-0} failed, ${skipped:-0} skipped, $((ms / 1000)).$((ms % 1000 / 100)) s"
  done
  # The CPU-vs-GPU error table from the records the suites printed (CUDA instances only).
  python3 "$repo/scripts/gpu-errors.py" --logs "$out"/*_gpu_test.log >"$out/gpu-errors.md"
  note "error table: $out/gpu-errors.md"
fi

if [[ " $steps " == *" bench "* ]]; then
  for b in "${gpu_bench_programs[@]}"; do
    bin=$build/bench/$b
    [[ -x $bin ]] || { note "$b: MISSING"; continue; }
    timeout 150 "$bin" --benchmark_filter='Device/device:1/' \
      --benchmark_out="$out/$b.json" \
      --benchmark_out_format=json >"$out/$b.log" 2>&1
    note "$b: rc $?"
  done
fi

if [[ " $steps " == *" fla "* && -n ${PHASOR_FLA_DIR:-} ]]; then
  timeout 200 python3 "$repo/bench/fla_compare.py" "$PHASOR_FLA_DIR" --out "$out/fla.jsonl" \
    >"$out/fla.log" 2>&1
  note "fla_compare: rc $? ($(grep -c '"library"' "$out/fla.jsonl" 2>/dev/null || echo 0) rows)"
fi

if [[ " $steps " == *" sanitize "* ]]; then
  if command -v compute-sanitizer >/dev/null; then
    for tool in memcheck racecheck; do
      for t in "${gpu_chunk_suites[@]}"; do
        bin=$build/tests/$t
        [[ -x $bin ]] || continue
        seconds=${PHASOR_SANITIZE_SECONDS:-30} filter=$cuda_only
        [[ $tool == racecheck ]] && seconds=${PHASOR_RACECHECK_SECONDS:-150} filter=$gpu_racecheck_filter
        timeout "$seconds" compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin" \
          --gtest_filter="$filter" --gtest_brief=1 >"$out/sanitize-$tool-$t.log" 2>&1
        rc=$?
        errors=$(grep -m1 -oE '(ERROR|RACECHECK) SUMMARY: [0-9]* (error|hazard)s?' "$out/sanitize-$tool-$t.log")
        note "compute-sanitizer $tool $t: rc $rc${errors:+, $errors}$([[ $rc == 124 ]] && echo ', stopped at the time cap')"
      done
    done
  else
    note "compute-sanitizer: not installed"
  fi
fi

echo
echo "== summary ($out)"
printf '  %s\n' "${summary[@]}"
