#!/usr/bin/env bash
# Install, build, and run the whole test suite: GoogleTest suites and the .pt round trip (ctest),
# then install the package and build and run examples/ against the installed copy, then a short
# smoke run of every benchmark program. Extra arguments go to cmake's configure step (CI passes
# -DPHASOR_WERROR=ON).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh "$@"  # extra arguments go to cmake's configure step
jobs=$(nproc)
log=build/ctest.log
(cd build && ctest --output-on-failure -j "$jobs" --timeout 900) | tee "$log"
ctest_count=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$log" | tail -1)
# ctest counts a skipped test (e.g. a CUDA-device test on a machine without a GPU) as passed:
# report those apart.
ctest_skipped=$(grep -c '^[[:space:]]*[0-9]* - .*(Skipped)$' "$log" || true)
skipped=$ctest_skipped

echo "== GPU resources: no shipped CUDA kernel spills registers (ptxas, the build's architectures)"
resources=0
if grep -q '^PHASOR_BUILT_CUDA:INTERNAL=1$' build/CMakeCache.txt; then
  # ptxas's reports from the build above (kept beside its objects): exits non-zero (and stops this
  # script) when a shipped kernel spills or a kernel file has no report.
  bash scripts/cuda-resources.sh --build build >build/cuda-resources.txt
  echo "cuda-resources: ok (the table is in build/cuda-resources.txt)"
  resources=1
else
  echo "cuda-resources: skipped (no nvcc: the CUDA backend is not built)"
  skipped=$((skipped + 1))
fi

echo "== install + examples/ against the installed package"
rm -rf build/install
cmake --install build --prefix build/install >/dev/null
bash examples/build_and_run.sh "$PWD/build/install"

echo "== benchmark smoke run (smallest size, one iteration each)"
benches=0
smoke='(T:1024|K:64)/'  # the smallest sequence length, or the smallest head dimension
# Plain programs (not Google Benchmark) and their smallest runs, separated by ';'.
declare -A plain_smoke=(
  [context_parallel_bench]="gla 256 2;gdn 256 2;fox 256 2"  # 1 process, then 2 (Gloo, loopback)
)
for b in build/bench/*_bench; do
  name=$(basename "$b")
  if [[ -n ${plain_smoke[$name]:-} ]]; then
    IFS=';' read -r -a runs <<<"${plain_smoke[$name]}"
    for run in "${runs[@]}"; do
      read -r -a args <<<"$run"
      "$b" "${args[@]}" >/dev/null
    done
    echo "$name: ok"
    benches=$((benches + 1))
    continue
  fi
  # A filter that matches nothing would "pass" without running anything: refuse that.
  if [[ -z "$("$b" --benchmark_list_tests --benchmark_filter="$smoke")" ]]; then
    echo "$(basename "$b"): no benchmark matches the smoke filter '$smoke'" >&2
    exit 1
  fi
  "$b" --benchmark_filter="$smoke" --benchmark_min_time=0 >/dev/null
  echo "$(basename "$b"): ok"
  benches=$((benches + 1))
done
# Every step above stops the script on failure, so reaching here means all of them passed.
echo "tests: $((ctest_count - ctest_skipped + resources + 1 + benches)) passed, 0 failed, $skipped skipped"
