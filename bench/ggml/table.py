#!/usr/bin/env python3
"""The table of bench/ggml-compare.sh: medians of ggml_compare's JSON lines, ratios, goals.

    python3 bench/ggml/table.py RESULTS.jsonl CHECKS.jsonl [--processes N] [--threads N]

Every figure is the median over the processes of one run (each process itself reports the median
of its timed calls); ratios divide two such medians of the same run. Standard library only.
"""
import argparse
import json
import statistics
from collections import defaultdict

LENGTHS = (1024, 4096, 16384)
FWD_BWD_T = 4096
OP_NAMES = {"gla": "GLA", "gdn": "Gated DeltaNet", "fox": "FoX"}


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("checks")
    parser.add_argument("--processes", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    seconds = defaultdict(list)
    for r in load(args.results):
        key = (r["library"], r["op"], r["mode"], r["impl"], r["T"], r["threads"])
        seconds[key].append(r["seconds"])

    def median(library, op, mode, impl, T, threads):
        values = seconds.get((library, op, mode, impl, T, threads))
        return statistics.median(values) if values else None

    ggml_impl = {"gla": "gated_linear_attn", "gdn": "gated_delta_net", "fox": "flash_attn_ext"}
    th = args.threads

    def fmt(x, digits=3):
        if x is None:
            return "—"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"

    def verdict(value, goal, higher_is_better):
        if value is None or goal is None:
            return ""
        met = value >= goal if higher_is_better else value <= goal
        return "met" if met else "**not met**"

    rows = []

    # judged: the value the goal is about (default: the ratio).
    def row(figure, ours, theirs, ratio, goal_text, goal, higher_is_better, judged=None):
        v = verdict(ratio if judged is None else judged, goal, higher_is_better)
        goal_cell = f"{goal_text} ({v})" if v else goal_text
        rows.append(f"| {figure} | {fmt(ours)} | {fmt(theirs)} | "
                    f"{fmt(ratio) + ('×' if ratio is not None else '')} | {goal_cell} |")

    # Forward throughput: tokens/s, ratio phasor ÷ ggml.
    goals = {("gla", "chunk"): 2.0, ("gla", "recurrent"): 1.0, ("gdn", "chunk"): 2.5,
             ("fox", "chunk"): 2.0}
    for op in ("gla", "gdn", "fox"):
        impls = ("chunk",) if op == "fox" else ("chunk", "recurrent")
        for T in LENGTHS:
            theirs_s = median("ggml", op, "forward", ggml_impl[op], T, th)
            for impl in impls:
                ours_s = median("phasor", op, "forward", impl, T, th)
                ours = T / ours_s if ours_s else None
                theirs = T / theirs_s if theirs_s else None
                ratio = ours / theirs if ours and theirs else None
                goal = goals.get((op, impl))
                name = "parallel_forgetting_attn" if op == "fox" else impl
                row(f"{OP_NAMES[op]} forward, tokens/s, T = {T}, {name} vs ggml_{ggml_impl[op]}",
                    ours, theirs, ratio, f"≥ {goal:g}×" if goal else "—", goal, True)

    # Decoding one token: µs per call, ratio phasor ÷ ggml (time).
    for op in ("gla", "gdn"):
        for threads in (1, 2):
            ours = median("phasor", op, "decode", "recurrent", 1, threads)
            theirs = median("ggml", op, "decode", ggml_impl[op], 1, threads)
            ours_us = ours * 1e6 if ours else None
            theirs_us = theirs * 1e6 if theirs else None
            ratio = ours / theirs if ours and theirs else None
            row(f"decoding one token, {OP_NAMES[op]}, µs, {threads} thread{'s' if threads > 1 else ''}",
                ours_us, theirs_us, ratio, "≤ 0.7× ggml's time", 0.7, False)

    # Forward + backward ÷ forward, phasor's chunk kernels.
    for op in ("gla", "gdn", "fox"):
        fb = median("phasor", op, "fwd_bwd", "chunk", FWD_BWD_T, th)
        fw = median("phasor", op, "forward", "chunk", FWD_BWD_T, th)
        ratio = fb / fw if fb and fw else None
        row(f"forward+backward ÷ forward, {OP_NAMES[op]}, chunk, T = {FWD_BWD_T} (phasor only)",
            ratio, None, None, "≤ 3.0", 3.0, False, judged=ratio)

    # Scaling: time(16k) ÷ time(4k).
    for op in ("gla", "gdn"):
        ours16, ours4 = (median("phasor", op, "forward", "chunk", T, th) for T in (16384, 4096))
        their16, their4 = (median("ggml", op, "forward", ggml_impl[op], T, th) for T in (16384, 4096))
        ours = ours16 / ours4 if ours16 and ours4 else None
        theirs = their16 / their4 if their16 and their4 else None
        row(f"time(16k) ÷ time(4k), {OP_NAMES[op]} (phasor chunk; ggml_{ggml_impl[op]})",
            ours, theirs, None, "≤ 4.2 (phasor)", 4.2, False, judged=ours)

    header = (f"float32, B = 1, H = 8, K = V = 128; forwards on {th} threads; medians of "
              f"{args.processes or '?'} interleaved processes per figure; ratios within this run "
              f"(forward rows: phasor's tokens/s ÷ ggml's; decoding: phasor's time ÷ ggml's).")
    print(header)
    print()
    print("| figure | phasor | ggml | ratio | goal |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(r)
    print()
    print("Agreement (max |phasor − ggml| / max |ggml|, float32 unless noted):")
    print()
    for c in load(args.checks):
        print(f"- {c['op']} {c['check']} ({c['impl']}, T = {c['T']}), {c['compared']}: "
              f"{c['max_relative_error']:.2e} (tolerance {c['tolerance']:g}: "
              f"{'pass' if c['pass'] else 'FAIL'})")


if __name__ == "__main__":
    main()
