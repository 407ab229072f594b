#!/usr/bin/env bash
# Device call 1 (2026-11-28, third session): Nsight Compute full sections + SASS source counters
# of GLA's states / intra / output kernels and Gated DeltaNet's dstates kernel at fla's shape
# (programs of f799737 built with -lineinfo; see README.md).
set -u
t0=$SECONDS
stamp() { echo "== [$((SECONDS - t0)) s] $*"; }
mkdir -p /tmp/b && tar -xJf .gpu/prof.tar.xz -C /tmp/b || exit 3
export LD_LIBRARY_PATH=/tmp/b/lib
out=/tmp/gc
mkdir -p "$out"
trap 'tar -czf "$OUT/logs.tgz" --exclude="*.ncu-rep" -C "$out" . 2>/dev/null' EXIT
stamp "start $(ncu --version | tail -1)"
prof() {  # name bench filter kernel-regex count
  timeout 100 ncu --clock-control none --set full --import-source yes -k "regex:$4" --launch-count "$5" \
    -o "$out/$1" /tmp/b/bench/$2 --benchmark_filter="$3" >"$out/$1.log" 2>&1
  stamp "$1 rc $?"
  ncu -i "$out/$1.ncu-rep" --page details >"$out/$1-details.txt" 2>&1
  ncu -i "$out/$1.ncu-rep" --page source --csv --print-source sass >"$out/$1-sass.csv" 2>&1
  stamp "$1 export rc $? $(wc -c <"$out/$1-sass.csv") bytes"
}
prof gla-fwd gla_bench 'BM_GlaChunkDevice/device:1/backward:0/B:2/T:16384/H:16/' 'states_kernel|intra_kernel|output_kernel' 3
prof gdn-bwd gated_delta_rule_bench 'BM_GatedDeltaRuleChunkDevice/device:1/backward:1/B:2/T:16384/H:16/' 'dstates_kernel' 1
rm -f "$out"/*.ncu-rep.tmp
stamp done
