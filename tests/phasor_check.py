"""What phasor's Python test scripts (tests/*_test.py, run by ctest) share: PASS/FAIL reporting
with the 'N passed, M failed' summary ctest's output ends with, the relative RMS error they compare
tensors by, and running the `phasor` command on .pt files.

The scripts import it as `import phasor_check` (Python puts a script's own folder on sys.path).
"""

import math
import os
import subprocess

passed = 0
failed = 0


def report(name, ok, detail=""):
    """Counts one check and prints 'PASS name' or 'FAIL name: detail' (flushed: the scripts also
    run child processes whose output interleaves with theirs)."""
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}: {detail}", flush=True)


def summary():
    """Prints 'N passed, M failed' and returns the exit status: 1 on any failure, else 0."""
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


def rel_rms(actual, expected):
    """sqrt(Σ(a − e)² / Σe²) in float64 (sqrt(Σ(a − e)²) when e is all zeros)."""
    a, e = actual.double(), expected.double()
    num = ((a - e) ** 2).sum().item()
    den = (e ** 2).sum().item()
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def run_phasor(phasor, args, out_path, timeout):
    """Runs `phasor *args --out out_path` (removing an old out_path first); returns (exit status,
    stderr, the torch.load of out_path or None when the command failed or wrote nothing)."""
    import torch  # here, so that scripts which never load a .pt do not need torch

    if os.path.exists(out_path):
        os.remove(out_path)
    proc = subprocess.run([phasor, *args, "--out", out_path], capture_output=True, text=True,
                          timeout=timeout)
    outputs = torch.load(out_path) if proc.returncode == 0 and os.path.exists(out_path) else None
    return proc.returncode, proc.stderr, outputs
