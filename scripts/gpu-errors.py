#!/usr/bin/env python3
"""The CPU-vs-GPU equivalence table of the README, from the GPU test suites' error records.

Every device-parametrised suite (tests/*_gpu_test) prints, at exit, the worst relative RMS error
it measured per key ("[phasor-gpu-error] <op> <output>[ (cpu kernel)] vs <reference|cpu kernel>
<dtype> worst relative RMS <e>"; tests/support/src/gpu_gtest.cpp). This runs the suites given
on the command line (default: build/tests/*_gpu_test) and prints, per op, the worst error over its
outputs and gradients: float64 and float32 against the float64 reference, float32 against the CPU
kernel, and for bfloat16 / float16 the GPU's error against the reference beside the CPU kernel's
on the same rounded inputs.

    python3 scripts/gpu-errors.py [build/tests/gla_gpu_test ...]
    python3 scripts/gpu-errors.py --logs gpu-check/*_gpu_test.log   # saved output (a GPU run's)

A suite run with both devices records the emulated and the CUDA instances under the same keys (the
worst of both); scripts/gpu-check.sh runs the CUDA instances alone, and --logs reads its logs.
"""
import glob
import pathlib
import re
import subprocess
import sys

LINE = re.compile(r"\[phasor-gpu-error\] (\S+) (.+?) vs (reference|cpu kernel) (\S+) worst "
                  r"relative RMS (\S+)")


def main():
    args = sys.argv[1:]
    if args[:1] == ["--logs"]:
        outputs = [pathlib.Path(path).read_text() for path in args[1:]]
        if not outputs:
            sys.exit("--logs: name the saved outputs of the GPU suites")
    else:
        binaries = args or sorted(glob.glob("build/tests/*_gpu_test"))
        if not binaries:
            sys.exit("no GPU test binaries found (build first, or name them)")
        # The suites' pass/fail is ctest's business; the records are printed either way.
        outputs = [subprocess.run([b], capture_output=True, text=True).stdout for b in binaries]
    worst = {}  # (op, column) -> error
    for out in outputs:
        for m in LINE.finditer(out):
            op, output, against, dtype, error = m.groups()
            who = "cpu" if output.endswith("(cpu kernel)") else "gpu"
            column = (who, against, dtype)
            key = (op, column)
            worst[key] = max(worst.get(key, 0.0), float(error))
    ops = sorted({op for op, _ in worst})

    def cell(op, *column):
        e = worst.get((op, column))
        return "—" if e is None else f"{e:.1e}"

    print("| op | float64 vs ref | float32 vs ref | float32 vs CPU | bfloat16: GPU (CPU) vs ref "
          "| float16: GPU (CPU) vs ref |")
    print("|---|---|---|---|---|---|")
    for op in ops:
        half = [f"{cell(op, 'gpu', 'reference', d)} ({cell(op, 'cpu', 'reference', d)})"
                for d in ("bfloat16", "float16")]
        print(f"| {op} | {cell(op, 'gpu', 'reference', 'float64')} "
              f"| {cell(op, 'gpu', 'reference', 'float32')} "
              f"| {cell(op, 'gpu', 'cpu kernel', 'float32')} | {half[0]} | {half[1]} |")


if __name__ == "__main__":
    main()
