#!/usr/bin/env bash
# Device call 3: fill_shared (loads in flight) in GLA / GDN / FoX chunk kernels, against HEAD.
set -u
repo=$PWD
t0=$SECONDS
stamp() { echo "== [$((SECONDS - t0)) s] $*"; }
mkdir -p /tmp/b && tar -xJf .gpu/bins.tar.xz -C /tmp/b || exit 3
export LD_LIBRARY_PATH=/tmp/b/lib PHASOR_SOURCE_DIR=$repo
out=/tmp/gc
mkdir -p "$out"
trap 'tar -czf "$OUT/logs.tgz" -C "$out" . 2>/dev/null' EXIT
stamp start
for t in gla_gpu_test gated_delta_rule_gpu_test forgetting_attn_gpu_test; do
  timeout 60 /tmp/b/tests/$t --gtest_filter='-*/emulated' --gtest_brief=1 >"$out/$t.log" 2>&1
  stamp "$t rc $? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) \]' "$out/$t.log" | paste -sd' ')"
done
python3 scripts/gpu-errors.py --logs "$out"/*_gpu_test.log >"$out/gpu-errors.md" 2>&1
ms() { grep -oE '^BM_[^ ]+ +[0-9.]+ ms' "$1" | sed -E 's/min_time:0.200\/(manual|real)_time//' | paste -sd' '; }
gla='BM_GlaChunkDevice/device:1/backward:1/B:2/T:16384/H:16/'
for v in head new; do
  bin=/tmp/b/bench/gla_bench
  [[ $v == head ]] && bin=/tmp/b/bench/gla_bench_head
  timeout 60 "$bin" --benchmark_filter="$gla" >"$out/bench-gla-$v.txt" 2>&1
  stamp "gla $v rc $? $(ms "$out/bench-gla-$v.txt")"
done
timeout 60 /tmp/b/bench/gla_bench --benchmark_filter='BM_GlaChunkDevice/device:1/backward:0/B:2/T:16384/H:16/' \
  >"$out/bench-gla-fwd-new.txt" 2>&1
stamp "gla fwd new rc $? $(ms "$out/bench-gla-fwd-new.txt")"
for v in head new; do
  bin=/tmp/b/bench/forgetting_attn_bench
  [[ $v == head ]] && bin=/tmp/b/bench/forgetting_attn_bench_head
  timeout 40 "$bin" --benchmark_filter='BM_FoxChunkDevice/device:1/.*/T:4096/' >"$out/bench-fox-$v.txt" 2>&1
  stamp "fox $v rc $? $(ms "$out/bench-fox-$v.txt")"
done
for v in head new; do
  bin=/tmp/b/bench/gated_delta_rule_bench
  [[ $v == head ]] && bin=/tmp/b/bench/gated_delta_rule_bench_head
  timeout 70 "$bin" --benchmark_filter='BM_GatedDeltaRuleChunkDevice/device:1/backward:[01]/B:2/T:16384/H:16/' \
    >"$out/bench-gdn-$v.txt" 2>&1
  stamp "gdn $v rc $? $(ms "$out/bench-gdn-$v.txt")"
done
timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 40 \
  --print-summary per-kernel /tmp/b/bench/gla_bench --benchmark_filter="$gla" \
  >"$out/ncu-per-kernel-gla.txt" 2>&1
stamp "ncu gla rc $?"
timeout 70 ncu --clock-control none --metrics gpu__time_duration.sum --launch-count 40 \
  --print-summary per-kernel /tmp/b/bench/gated_delta_rule_bench \
  --benchmark_filter='BM_GatedDeltaRuleChunkDevice/device:1/backward:1/B:2/T:16384/H:16/' \
  >"$out/ncu-per-kernel-gdn.txt" 2>&1
stamp "ncu gdn rc $?"
for t in gla_gpu_test gated_delta_rule_gpu_test forgetting_attn_gpu_test; do
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/b/tests/$t \
    --gtest_filter='*/cuda' --gtest_brief=1 >"$out/memcheck-$t.log" 2>&1
  stamp "memcheck $t rc $? $(grep -m1 -o 'ERROR SUMMARY: [0-9]* error' "$out/memcheck-$t.log")"
done
stamp end
