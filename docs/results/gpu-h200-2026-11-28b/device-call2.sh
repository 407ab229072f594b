#!/usr/bin/env bash
# Device call 2 (2026-11-28, third session): 16-byte vector loads of the token-row tiles
# (cuda/common/fill.h load_token_rows) in GLA / Gated DeltaNet chunk kernels, against f799737.
# (Its GLA rows ran past their 70 s timeouts: two benchmarks a process took longer; the
# forward rows had printed. Call 3 times GLA's forward + backward alone.)
set -u
t0=$SECONDS
stamp() { echo "== [$((SECONDS - t0)) s] $*"; }
mkdir -p /tmp/b && tar -xJf .gpu/bins.tar.xz -C /tmp/b && tar -xJf .gpu/head.tar.xz -C /tmp/b || exit 3
export LD_LIBRARY_PATH=/tmp/b/lib PHASOR_SOURCE_DIR=$PWD
out=/tmp/gc
mkdir -p "$out"
trap 'tar -czf "$OUT/logs.tgz" -C "$out" . 2>/dev/null' EXIT
stamp start
for t in simt_test gla_gpu_test gated_delta_rule_gpu_test forgetting_attn_gpu_test; do
  timeout 60 /tmp/b/tests/$t --gtest_filter='-*/emulated:SimtFaults.*:SimtSchedules.*' --gtest_brief=1 >"$out/$t.log" 2>&1
  stamp "$t rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$out/$t.log" | paste -sd' ')"
done
python3 scripts/gpu-errors.py --logs "$out"/*_gpu_test.log >"$out/gpu-errors.md" 2>&1
for t in gla_gpu_test gated_delta_rule_gpu_test; do
  timeout 60 compute-sanitizer --tool memcheck /tmp/b/tests/$t --gtest_filter='*/cuda' --gtest_brief=1 >"$out/memcheck-$t.log" 2>&1
  stamp "memcheck $t rc $? $(grep -E 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"
done
ms() { grep -oE '^BM_[^ ]+ +[0-9.]+ ms' "$1" | sed -E 's/min_time:0.200\/(manual|real)_time//' | paste -sd' '; }
for v in head new head; do
  suffix=""; [[ $v == head ]] && suffix=_head
  timeout 70 /tmp/b/bench/gla_bench$suffix --benchmark_filter='BM_GlaChunkDevice/device:1/backward:[01]/B:2/T:16384/H:16/' \
    >"$out/bench-gla-$v.txt" 2>&1
  stamp "gla $v rc $? $(ms "$out/bench-gla-$v.txt")"
done
timeout 70 /tmp/b/bench/gla_bench --benchmark_filter='BM_GlaChunkDevice/device:1/backward:[01]/B:2/T:16384/H:16/' \
  >"$out/bench-gla-new2.txt" 2>&1
stamp "gla new rc $? $(ms "$out/bench-gla-new2.txt")"
for v in head new; do
  suffix=""; [[ $v == head ]] && suffix=_head
  timeout 80 /tmp/b/bench/gated_delta_rule_bench$suffix \
    --benchmark_filter='BM_GatedDeltaRuleChunkDevice/device:1/backward:[01]/B:2/T:16384/H:16/' \
    >"$out/bench-gdn-$v.txt" 2>&1
  stamp "gdn $v rc $? $(ms "$out/bench-gdn-$v.txt")"
done
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 40 \
  --print-summary per-kernel /tmp/b/bench/gla_bench \
  --benchmark_filter='BM_GlaChunkDevice/device:1/backward:1/B:2/T:16384/H:16/' >"$out/ncu-per-kernel-gla.txt" 2>&1
stamp "ncu gla rc $?"
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 40 \
  --print-summary per-kernel /tmp/b/bench/gated_delta_rule_bench \
  --benchmark_filter='BM_GatedDeltaRuleChunkDevice/device:1/backward:1/B:2/T:16384/H:16/' \
  >"$out/ncu-per-kernel-gdn.txt" 2>&1
stamp "ncu gdn rc $?"
stamp end
