#!/usr/bin/env bash
# Device call 3 (2026-11-28, third session): 16-byte vector loads and stores of the token-row tiles
# in GLA / Gated DeltaNet / FoX chunk kernels; GLA and FoX against f799737.
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
  timeout 30 /tmp/b/tests/$t --gtest_filter='-*/emulated:SimtFaults.*:SimtSchedules.*' --gtest_brief=1 >"$out/$t.log" 2>&1
  stamp "$t rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$out/$t.log" | paste -sd' ')"
done
python3 scripts/gpu-errors.py --logs "$out"/*_gpu_test.log >"$out/gpu-errors.md" 2>&1
for t in gla_gpu_test gated_delta_rule_gpu_test forgetting_attn_gpu_test; do
  timeout 30 compute-sanitizer --tool memcheck /tmp/b/tests/$t --gtest_filter='*/cuda' --gtest_brief=1 >"$out/memcheck-$t.log" 2>&1
  stamp "memcheck $t rc $? $(grep -E 'ERROR SUMMARY' "$out/memcheck-$t.log" | tail -1)"
done
ms() { grep -oE '^BM_[^ ]+ +[0-9.]+ ms' "$1" | sed -E 's/min_time:0.200\/(manual|real)_time//' | paste -sd' '; }
gla='BM_GlaChunkDevice/device:1/backward:1/B:2/T:16384/H:16/'
for v in head new; do
  suffix=""; [[ $v == head ]] && suffix=_head
  timeout 55 /tmp/b/bench/gla_bench$suffix --benchmark_filter="$gla" >"$out/bench-gla-$v.txt" 2>&1
  stamp "gla $v rc $? $(ms "$out/bench-gla-$v.txt")"
done
for v in head new; do
  suffix=""; [[ $v == head ]] && suffix=_head
  timeout 25 /tmp/b/bench/forgetting_attn_bench$suffix --benchmark_filter='BM_FoxChunkDevice/device:1/.*/T:4096/' \
    >"$out/bench-fox-$v.txt" 2>&1
  stamp "fox $v rc $? $(ms "$out/bench-fox-$v.txt")"
done
timeout 60 /tmp/b/bench/gated_delta_rule_bench \
  --benchmark_filter='BM_GatedDeltaRuleChunkDevice/device:1/backward:1/B:2/T:16384/H:16/' >"$out/bench-gdn-new.txt" 2>&1
stamp "gdn new rc $? $(ms "$out/bench-gdn-new.txt")"
timeout 40 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 40 \
  --print-summary per-kernel /tmp/b/bench/gla_bench --benchmark_filter="$gla" >"$out/ncu-per-kernel-gla.txt" 2>&1
stamp "ncu gla rc $?"
stamp end
