#!/usr/bin/env python3
"""Where a kernel's time goes, instruction by instruction, from Nsight Compute's source page.

On the GPU machine, profile with source counters and export the SASS view as CSV:

    ncu --clock-control none --set full --import-source yes -k regex:states_kernel \\
        --launch-count 1 -o prof <program> <args>
    ncu -i prof.ncu-rep --page source --csv --print-source sass > prof-sass.csv

Then, anywhere (no Nsight needed):

    python3 scripts/ncu-sass-summary.py prof-sass.csv [--kernel N] [--top 25]

prints, per profiled kernel (or the N-th only), the warp-stall sampling by reason and by opcode,
the executed warp instructions by opcode, and the instructions with the most stall samples and
their three main stall reasons. A load whose consumer waits shows up as that consumer stalled
on long_sb (global memory) or short_sb (shared memory, MUFU); integer opcodes (IMAD, ISETP, LEA,
LOP3, SHF, IADD3) dominating the executed instructions mean index arithmetic, not math.
"""
import argparse
import collections
import csv
import sys


def sections(path):
    """(kernel name, rows as dicts) for each kernel section of the CSV."""
    out, header = [], None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                out.append((row[1], []))
                header = None
            elif row[0] == "Address":
                header = row
            elif header is not None and out:
                out[-1][1].append(dict(zip(header, row)))
    return out


def number(row, key):
    value = row.get(key, "") or "0"
    try:
        return int(value.replace(",", ""))
    except ValueError:
        return 0


def opcode(source):
    words = source.split()
    if not words:
        return "?"
    word = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return word.split(".")[0]


def summarise(name, rows, top):
    samples_key = "Warp Stall Sampling (All Samples)"
    stall_keys = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(number(r, samples_key) for r in rows) or 1
    print(f"{name}\n  {len(rows)} instructions, {total} stall samples")
    reasons = collections.Counter()
    for r in rows:
        for k in stall_keys:
            reasons[k[len("stall_"):]] += number(r, k)
    print("  stall reasons: " + ", ".join(f"{k} {v / total:.0%}" for k, v in reasons.most_common(8)))
    by_samples, by_executed = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"])
        by_samples[op] += number(r, samples_key)
        by_executed[op] += number(r, "Instructions Executed")
    executed = sum(by_executed.values()) or 1
    print("  stall samples by opcode: " +
          ", ".join(f"{k} {v / total:.0%}" for k, v in by_samples.most_common(12)))
    print(f"  executed warp instructions {executed}, by opcode: " +
          ", ".join(f"{k} {v / executed:.0%}" for k, v in by_executed.most_common(12)))
    print("  hottest instructions (address, samples, executed, SASS, main stalls):")
    for r in sorted(rows, key=lambda r: -number(r, samples_key))[:top]:
        stalls = sorted(((number(r, k), k[len("stall_"):]) for k in stall_keys), reverse=True)[:3]
        text = ", ".join(f"{k} {v}" for v, k in stalls if v)
        print(f"    {r['Address'][-6:]} {number(r, samples_key):8d} "
              f"{number(r, 'Instructions Executed'):11d}  {r['Source'].strip()[:56]:56s} {text}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    parser.add_argument("--kernel", type=int, help="only the N-th kernel section (from 0)")
    parser.add_argument("--top", type=int, default=15, help="hottest instructions to list")
    args = parser.parse_args()
    found = sections(args.csv)
    if not found:
        sys.exit(f"ncu-sass-summary: no kernel sections in {args.csv}")
    seen = set()
    for i, (name, rows) in enumerate(found):
        if args.kernel is not None and i != args.kernel:
            continue
        if args.kernel is None and (name, len(rows)) in seen:
            continue  # ncu repeats a section per source view; print each kernel once
        seen.add((name, len(rows)))
        if rows:
            summarise(name, rows, args.top)


if __name__ == "__main__":
    main()
