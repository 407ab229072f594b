#!/usr/bin/env python3
"""The `phasor tasks sample` and `phasor tasks run` commands, checked from Python's torch.

    python3 tasks_sample_test.py <path to the phasor executable>

Runs `phasor tasks sample` for every task, loads the file with torch.load and checks the
invariants of each generator independently of the C++ tests (tests/tasks_data_test.cpp): shapes
and dtypes, the vocabulary, MQAR's key/value layout and that every query's target is the value
paired with its key in the context, the copy examples `$ s | s .` and their targets, the running
XOR of parity and the running products of the group word problems (recomputed here from
permutations), determinism in the seed, and that bad input exits with status 2 and a message
naming the option; then a tiny `phasor tasks run` grid, the OpenBLAS kernels it runs on, its
--resume and its config errors, and `phasor tasks probe` on the checkpoint of a tiny parity run.
Prints 'N passed, M failed' last and exits non-zero on any failure.
"""
import itertools
import math
import os
import subprocess
import sys
import tempfile

import torch

import phasor_check
from phasor_check import report, summary

PHASOR = sys.argv[1] if len(sys.argv) > 1 else "phasor"
WORK = tempfile.mkdtemp(prefix="phasor_tasks_sample_")
IGNORE = -100


def sample(task, *args):
    """Runs `phasor tasks sample TASK *args --out F`; returns (status, stderr, dict or None)."""
    return phasor_check.run_phasor(PHASOR, ["tasks", "sample", task, *args],
                                   os.path.join(WORK, "batch.pt"), timeout=60)


def check_layout(name, data, rows, cols, vocab):
    """Keys, dtypes, shapes; inputs in [0, vocab); targets in [0, vocab) or −100."""
    if data is None:
        report(name + " layout", False, "no output")
        return False
    inputs, targets = data.get("inputs"), data.get("targets")
    problems = []
    if set(data.keys()) != {"inputs", "targets", "vocab_size"}:
        problems.append(f"keys {sorted(data.keys())}")
    for key, t in (("inputs", inputs), ("targets", targets)):
        if t is None or t.dtype != torch.int64 or tuple(t.shape) != (rows, cols):
            problems.append(f"{key}: {None if t is None else (t.dtype, tuple(t.shape))}")
    if not problems:
        if int(data["vocab_size"]) != vocab:
            problems.append(f"vocab_size {int(data['vocab_size'])} != {vocab}")
        if inputs.min() < 0 or inputs.max() >= vocab:
            problems.append("inputs outside the vocabulary")
        scored = targets[targets != IGNORE]
        if scored.numel() and (scored.min() < 0 or scored.max() >= vocab):
            problems.append("targets outside the vocabulary")
    report(name + " layout", not problems, "; ".join(problems))
    return not problems


# ---- MQAR -------------------------------------------------------------------------------------------
def check_mqar(name, args, rows, L, V, n, zero_filler):
    status, err, data = sample("mqar", *args)
    if status != 0:
        report(name, False, f"exit {status}: {err}")
        return
    if not check_layout(name, data, rows, L, V):
        return
    x, y = data["inputs"], data["targets"]
    problems = []
    for r in range(rows):
        keys = x[r, 0:2 * n:2].tolist()
        values = x[r, 1:2 * n:2].tolist()
        if len(set(keys)) != n or not all(1 <= k < V // 2 for k in keys):
            problems.append(f"row {r}: keys {keys} not distinct in [1, V/2)")
        if len(set(values)) != n or not all(V // 2 <= v < V for v in values):
            problems.append(f"row {r}: values {values} not distinct in [V/2, V)")
        if (y[r, :2 * n] != IGNORE).any():
            problems.append(f"row {r}: the context is scored")
        pair = dict(zip(keys, values))
        queries = [t for t in range(2 * n, L) if y[r, t] != IGNORE]
        # n queries, one per key, at even offsets from 2n, each labelled with its key's value.
        if sorted(x[r, t].item() for t in queries) != sorted(keys):
            problems.append(f"row {r}: queried keys {[x[r, t].item() for t in queries]}")
        for t in queries:
            if (t - 2 * n) % 2 != 0:
                problems.append(f"row {r}: query at odd offset {t}")
            if y[r, t].item() != pair.get(x[r, t].item()):
                problems.append(f"row {r}, position {t}: target {y[r, t].item()} is not the value "
                                f"of key {x[r, t].item()}")
        filler = [x[r, t].item() for t in range(2 * n, L) if y[r, t] == IGNORE]
        if zero_filler and any(f != 0 for f in filler):
            problems.append(f"row {r}: non-zero filler with --zero-filler")
    if not zero_filler and all(f == 0 for f in x[:, 2 * n:][y[:, 2 * n:] == IGNORE].tolist()):
        problems.append("random filler is all zeros")
    report(name, not problems, "; ".join(problems[:5]))


check_mqar("mqar zero filler", ["--batch", "8", "--seq-len", "32", "--vocab-size", "40",
                                "--num-kv-pairs", "4", "--zero-filler", "--seed", "7"],
           8, 32, 40, 4, True)
check_mqar("mqar random filler", ["--batch", "5", "--seq-len", "64", "--vocab-size", "100",
                                  "--num-kv-pairs", "16", "--power-a", "1", "--seed", "3"],
           5, 64, 100, 16, False)
check_mqar("mqar defaults", [], 4, 64, 8192, 8, False)

# The documented example of data.h (V = 20, n = 2, L = 16, filler 0, seed 2026).
status, err, data = sample("mqar", "--batch", "1", "--seq-len", "16", "--vocab-size", "20",
                           "--num-kv-pairs", "2", "--zero-filler", "--seed", "2026")
report("mqar documented example",
       data is not None and data["inputs"][0].tolist()
       == [9, 11, 2, 19, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 0, 0]
       and data["targets"][0, 6].item() == 19 and data["targets"][0, 10].item() == 11,
       f"exit {status}: {err} {None if data is None else data['inputs'][0].tolist()}")


# ---- copying ------------------------------------------------------------------------------------------
START, SEP, END, PAD = 26, 27, 28, 29


def check_copy_row(x, y, min_len, max_len):
    """Parses a packed row `$ s | s . $ s | s . ... pad*` with min_len ≤ |s| ≤ max_len; returns a
    problem or None."""
    t, cols = 0, len(x)
    examples = 0
    while t < cols and x[t] == START:
        sep = x.index(SEP, t) if SEP in x[t:] else -1
        if sep < 0:
            return f"no separator after position {t}"
        s = x[t + 1:sep]
        n = len(s)
        if not min_len <= n <= max_len or any(not 0 <= c < 26 for c in s):
            return f"bad string {s}"
        if x[sep + 1:sep + 1 + n] != s or x[sep + 1 + n] != END:
            return f"the copy at {sep + 1} is not s."
        want = [IGNORE] * (n + 1) + s + [END] + [IGNORE]
        if y[t:t + 2 * n + 3] != want:
            return f"targets {y[t:t + 2 * n + 3]} != {want}"
        t += 2 * n + 3
        examples += 1
    if examples == 0:
        return "no example"
    if any(c != PAD for c in x[t:]) or any(c != IGNORE for c in y[t:]):
        return f"the rest from {t} is not pad / −100"
    return None


status, err, data = sample("copy", "--batch", "6", "--seq-len", "40", "--min-len", "2",
                           "--max-len", "6", "--seed", "11")
if check_layout("copy", data, 6, 40, 30):
    problems = [p for p in (check_copy_row(data["inputs"][r].tolist(), data["targets"][r].tolist(),
                                           2, 6) for r in range(6)) if p]
    report("copy packing and targets", not problems, "; ".join(problems))

status, err, data = sample("copy_eval", "--batch", "3", "--length", "7", "--seed", "5")
if check_layout("copy_eval", data, 3, 2 * 7 + 3, 30):
    problems = [p for p in (check_copy_row(data["inputs"][r].tolist(), data["targets"][r].tolist(),
                                           7, 7) for r in range(3)) if p]
    report("copy_eval rows", not problems, "; ".join(problems))


# ---- word problems --------------------------------------------------------------------------------
def group_elements(name):
    """The elements in the order of data.h: S_n in lexicographic one-line order, A3 the even ones."""
    n = {"S2": 2, "A3": 3, "S3": 3, "S5": 5}[name]
    perms = list(itertools.permutations(range(n)))  # lexicographic

    def even(p):
        return sum(1 for i in range(n) for j in range(i + 1, n) if p[i] > p[j]) % 2 == 0

    return [p for p in perms if even(p)] if name == "A3" else perms


def check_word(task, group, rows, T, final_only, seed, bos=False):
    args = ["--batch", str(rows), "--seq-len", str(T), "--seed", str(seed)]
    if final_only:
        args.append("--final-only")
    if bos:
        args.append("--bos")
    status, err, data = sample(task, *args)
    elements = group_elements(group)
    name = f"{task} T={T}{' final-only' if final_only else ''}{' bos' if bos else ''}"
    lead = 1 if bos else 0  # a BOS token (id |G|, no target) before the T elements
    if not check_layout(name, data, rows, T + lead, len(elements) + lead):
        return
    index = {p: i for i, p in enumerate(elements)}
    problems = []
    for r in range(rows):
        if bos and (data["inputs"][r, 0].item() != len(elements)
                    or data["targets"][r, 0].item() != IGNORE):
            problems.append(f"row {r}: starts {data['inputs'][r, 0].item()}, "
                            f"target {data['targets'][r, 0].item()}")
        prod = tuple(range(len(elements[0])))
        for t in range(T):
            a = elements[data["inputs"][r, t + lead].item()]
            prod = tuple(a[prod[i]] for i in range(len(prod)))  # prod·a: prod first, then a
            want = index[prod] if (not final_only or t == T - 1) else IGNORE
            if data["targets"][r, t + lead].item() != want:
                problems.append(f"row {r}, t {t}: target {data['targets'][r, t + lead].item()}"
                                f" != {want}")
                break
    report(name + " running product", not problems, "; ".join(problems[:3]))
    return data


data = check_word("parity", "S2", 6, 33, False, 1)
if data is not None:
    xor = torch.cumsum(data["inputs"], dim=1) % 2
    report("parity is the running XOR", torch.equal(xor, data["targets"]))
check_word("parity", "S2", 4, 17, True, 2)
check_word("s2", "S2", 3, 9, False, 3)
check_word("a3", "A3", 4, 20, False, 4)
check_word("s3", "S3", 4, 21, False, 5)
check_word("s5", "S5", 3, 30, True, 6)
plain = check_word("parity", "S2", 5, 19, False, 7)
with_bos = check_word("parity", "S2", 5, 19, False, 7, bos=True)
if plain is not None and with_bos is not None:
    report("bos: the same rows one position later",
           torch.equal(with_bos["inputs"][:, 1:], plain["inputs"])
           and torch.equal(with_bos["targets"][:, 1:], plain["targets"]))
check_word("s3", "S3", 3, 12, True, 8, bos=True)

# ---- determinism ----------------------------------------------------------------------------------
_, _, a = sample("s5", "--batch", "4", "--seq-len", "16", "--seed", "9")
_, _, b = sample("s5", "--batch", "4", "--seq-len", "16", "--seed", "9")
_, _, c = sample("s5", "--batch", "4", "--seq-len", "16", "--seed", "10")
_, _, d = sample("s5", "--batch", "2", "--seq-len", "16", "--seed", "9")
report("same seed, same batch; other seed, other batch; prefix rows",
       a is not None and b is not None and c is not None and d is not None
       and torch.equal(a["inputs"], b["inputs"]) and not torch.equal(a["inputs"], c["inputs"])
       and torch.equal(a["inputs"][:2], d["inputs"]))


# ---- bad input: exit 2 and the option named ---------------------------------------------------------
def check_error(name, task, args, needle):
    status, err, data = sample(task, *args)
    report("error: " + name, status == 2 and needle in err and data is None,
           f"exit {status}, stderr {err!r}")


check_error("odd mqar length", "mqar", ["--seq-len", "15"], "--seq-len")
check_error("mqar vocabulary too small", "mqar", ["--seq-len", "32", "--vocab-size", "20"],
            "--vocab-size")
check_error("too many kv pairs", "mqar", ["--seq-len", "16", "--vocab-size", "40",
                                          "--num-kv-pairs", "5"], "--num-kv-pairs")
check_error("negative power", "mqar", ["--power-a", "-1"], "--power-a")
check_error("copy context too short", "copy", ["--seq-len", "10"], "--seq-len")
check_error("copy max < min", "copy", ["--min-len", "5", "--max-len", "3"], "--max-len")
check_error("copy_eval length 0", "copy_eval", ["--length", "0"], "--length")
check_error("batch 0", "parity", ["--batch", "0"], "--batch")
check_error("seq-len 0", "s3", ["--seq-len", "0"], "--seq-len")
check_error("too many tokens", "s3", ["--seq-len", "100000", "--batch", "100000"], "--batch")
check_error("option of another task", "parity", ["--num-kv-pairs", "3"], "--num-kv-pairs")
check_error("unknown task", "s4", [], "TASK")
check_error("not a number", "mqar", ["--batch", "many"], "--batch")
proc = subprocess.run([PHASOR, "tasks", "sample", "s3", "--out",
                       os.path.join(WORK, "no", "such", "dir.pt")],
                      capture_output=True, text=True, timeout=60)
report("error: unwritable --out", proc.returncode == 2 and "--out" in proc.stderr, proc.stderr)
proc = subprocess.run([PHASOR, "tasks", "sample", "s3"], capture_output=True, text=True, timeout=60)
report("error: missing --out", proc.returncode == 2 and "--out" in proc.stderr, proc.stderr)


# ---- phasor tasks run: a tiny grid end to end and config errors (the runner's own tests are in
# tests/tasks_experiment_test.cpp; this checks the command line around it) ----------------------------
import json  # noqa: E402

TINY = {
    "name": "tiny_cli",
    "task": {"name": "s3", "train_lengths": [6], "eval_lengths": [3, 12], "eval_batch": 8},
    "model": {"hidden_size": 8, "num_layers": 1, "num_heads": 1, "mlp": False},
    "arms": [{"name": "fox", "model": {"mixer": "fox"}}],
    "train": {"steps": 4, "batch_size": 2, "eval_every": 0, "log_every": 0},
    "lr_grid": [0.01],
    "seeds": [5],
}


def run_config(config, *extra, env=None, out_name="run_out"):
    path = os.path.join(WORK, "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    out = os.path.join(WORK, out_name)
    return subprocess.run([PHASOR, "tasks", "run", path, "--out", out, "--quiet", *extra],
                          capture_output=True, text=True, timeout=120, env=env), out


proc, out = run_config(TINY, "--threads", "1")
ok = proc.returncode == 0 and "fox" in proc.stdout and "6*" in proc.stdout
for name in ("results.json", "results.csv", "accuracy_vs_length.png", "loss.png"):
    ok = ok and os.path.exists(os.path.join(out, name))
if ok:
    with open(os.path.join(out, "results.json")) as f:
        results = json.load(f)
    ok = results["config"] == TINY and len(results["runs"]) == 1 and \
        [e["length"] for e in results["runs"][0]["eval_by_length"]] == [3, 6, 12]
report("tasks run: tiny grid", ok, proc.stdout + proc.stderr)

# LibTorch's matmuls run on OpenBLAS (Debian), which falls back to its generic SSE3 kernels
# ("Prescott") on a CPU model it does not know; `phasor` then re-executes itself with
# OPENBLAS_CORETYPE set to kernels the CPU supports (phasor/tasks/blas.h) unless the variable is set.
flags = set()
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}


def run_blas_core(env, out_name):
    """Runs TINY with `env`; returns (the process, results.json's machine.blas_core or None)."""
    proc, out = run_config(TINY, "--threads", "1", env=env, out_name=out_name)
    if proc.returncode != 0:
        return proc, None
    with open(os.path.join(out, "results.json")) as f:
        return proc, json.load(f)["machine"].get("blas_core")


proc, core = run_blas_core(env, "run_blas_default")
vector_cpu = {"avx2", "fma"} <= flags
report("tasks run: OpenBLAS runs kernels this CPU supports, not its generic ones",
       proc.returncode == 0 and bool(core) and
       (not vector_cpu or core.lower() != "prescott") and f"OpenBLAS kernels: {core}" in proc.stdout,
       f"blas_core {core!r}, avx2+fma {vector_cpu}\n{proc.stdout}{proc.stderr}")
proc, core = run_blas_core(dict(env, OPENBLAS_CORETYPE="Prescott"), "run_blas_prescott")
report("tasks run: OPENBLAS_CORETYPE set by the user is kept", core == "Prescott",
       f"blas_core {core!r}\n{proc.stdout}{proc.stderr}")

proc, _ = run_config(TINY, "--resume")
report("tasks run --resume: nothing left to train", proc.returncode == 0 and "fox" in proc.stdout,
       proc.stderr)

bad = json.loads(json.dumps(TINY))
bad["arms"][0]["model"]["mixer"] = "foxx"
proc, _ = run_config(bad)
report("tasks run: bad mixer exits 2 naming the key",
       proc.returncode == 2 and "config.arms[0].model.mixer" in proc.stderr and "'foxx'" in proc.stderr,
       proc.stderr)
proc = subprocess.run([PHASOR, "tasks", "run", os.path.join(WORK, "missing.json")],
                      capture_output=True, text=True, timeout=60)
report("tasks run: missing config exits 2", proc.returncode == 2 and "missing.json" in proc.stderr,
       proc.stderr)
proc, _ = run_config(TINY, "--threads", "-1")
report("tasks run: negative --threads", proc.returncode == 2 and "--threads" in proc.stderr,
       proc.stderr)

# ---- phasor tasks probe: the parity phase probe of a trained checkpoint ---------------------------
PROBE = {
    "name": "tiny_probe_cli",
    "task": {"name": "parity", "bos": True, "train_lengths": [8], "eval_lengths": [16],
             "eval_batch": 8},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "mlp": False},
    # The official settings' linear phase path (no SiLU, no phase gate), which --remove-drift needs.
    "arms": [{"name": "srope", "model": {"mixer": "gla", "pos_encoding": "selective_rope",
                                         "pos_options": {"gate": "none", "conv_silu": False}}}],
    "train": {"steps": 4, "batch_size": 2, "eval_every": 0, "log_every": 0},
    "lr_grid": [0.01],
    "seeds": [3],
}
proc, out = run_config(PROBE, "--threads", "1", out_name="probe_out")
ckpt = os.path.join(out, "checkpoints", "srope.lr0.01.seed3.ckpt")
report("tasks run: a parity Selective RoPE run keeps its checkpoint and prints the phase probe",
       proc.returncode == 0 and os.path.exists(ckpt) and "phase probe (parity" in proc.stdout,
       proc.stdout + proc.stderr)
probe_json = os.path.join(WORK, "probe.json")
proc = subprocess.run([PHASOR, "tasks", "probe", ckpt, "--length", "40", "--rows", "6", "--json",
                       probe_json], capture_output=True, text=True, timeout=60)
ok = proc.returncode == 0 and "correct prefix" in proc.stdout and os.path.exists(probe_json)
if ok:
    with open(probe_json) as f:
        probe = json.load(f)
    heads = probe.get("heads", [])
    ok = (probe.get("length") == 41 and probe.get("rows") == 6 and len(heads) == 2 and
          all(1 <= h["horizon"] <= 41 and 1 <= h["harmonic"] <= 4 for h in heads) and
          0 <= probe.get("correct_prefix_length", -1) <= 41)
    # One printed line per head, after the header.
    ok = ok and len([line for line in proc.stdout.splitlines() if line.startswith("    0 ")]) == 2
report("tasks probe: a head per line and the JSON beside the model's correct prefix", ok,
       proc.stdout + proc.stderr)
# --remove-drift 0: every pair of layer 0 (2 heads × 2 pairs) edited, the edited model scored.
proc = subprocess.run([PHASOR, "tasks", "probe", ckpt, "--length", "40", "--rows", "6",
                       "--remove-drift", "0", "--json", probe_json],
                      capture_output=True, text=True, timeout=60)
ok = proc.returncode == 0 and "held-out rows (seed 1)" in proc.stdout
if ok:
    with open(probe_json) as f:
        edited = json.load(f).get("edited", {})
    removed = edited.get("drift", {})
    pairs = removed.get("pairs", [])
    ok = (removed.get("min_horizon") == 0 and len(pairs) == 4 and "decay" not in edited and
          all(abs(p["drift_zero"]) <= math.pi and abs(p["drift_one"]) <= math.pi for p in pairs) and
          0 <= edited.get("heldout_after", {}).get("correct_prefix_length", -1) <= 41)
report("tasks probe --remove-drift: every pair's drift removed, the edited model scored", ok,
       proc.stdout + proc.stderr)
# --remove-drift 0 --remove-decay 0: both edits of every pair; the gates removed are log gates ≤ 0.
proc = subprocess.run([PHASOR, "tasks", "probe", ckpt, "--length", "40", "--rows", "6",
                       "--remove-drift", "0", "--remove-decay", "0", "--json", probe_json],
                      capture_output=True, text=True, timeout=60)
ok = proc.returncode == 0 and "forget-gate decay of 4 rotation pairs" in proc.stdout
if ok:
    with open(probe_json) as f:
        edited = json.load(f).get("edited", {})
    decay = edited.get("decay", {}).get("pairs", [])
    ok = (len(edited.get("drift", {}).get("pairs", [])) == 4 and len(decay) == 4 and
          all(p["log_gate_zero"] <= 0 and p["log_gate_one"] <= 0 for p in decay) and
          any(p["log_gate_zero"] < 0 for p in decay) and
          0 <= edited.get("correct_prefix_length", -1) <= 41)
report("tasks probe --remove-drift --remove-decay: both edits of every pair, the model scored", ok,
       proc.stdout + proc.stderr)
for flag in ("--remove-drift", "--remove-decay"):
    proc = subprocess.run([PHASOR, "tasks", "probe", ckpt, flag, "-1"],
                          capture_output=True, text=True, timeout=60)
    report(f"tasks probe: {flag} -1 exits 2 naming it",
           proc.returncode == 2 and flag in proc.stderr, proc.stderr)
proc = subprocess.run([PHASOR, "tasks", "probe", ckpt, "--length", "0"],
                      capture_output=True, text=True, timeout=60)
report("tasks probe: --length 0 exits 2 naming it",
       proc.returncode == 2 and "--length" in proc.stderr, proc.stderr)
proc = subprocess.run([PHASOR, "tasks", "probe", os.path.join(WORK, "missing.ckpt")],
                      capture_output=True, text=True, timeout=60)
report("tasks probe: a missing checkpoint exits 2 naming it",
       proc.returncode == 2 and "missing.ckpt" in proc.stderr, proc.stderr)
corrupt = os.path.join(WORK, "corrupt.ckpt")
with open(ckpt, "rb") as f:
    whole = f.read()
with open(corrupt, "wb") as f:
    f.write(whole[:len(whole) // 2])  # a checkpoint cut short
proc = subprocess.run([PHASOR, "tasks", "probe", corrupt],
                      capture_output=True, text=True, timeout=60)
report("tasks probe: a truncated checkpoint exits 2 naming it",
       proc.returncode == 2 and "corrupt.ckpt" in proc.stderr, proc.stderr)

sys.exit(summary())
