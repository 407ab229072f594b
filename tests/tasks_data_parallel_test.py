#!/usr/bin/env python3
"""Data-parallel `phasor tasks run` (c10d/Gloo on the loopback) against the single-process run.

    python3 tasks_data_parallel_test.py <path to the phasor executable>

1. Equality: tiny grids trained by one process and by `--nproc 2` (the same global batch, each
   rank on half of its rows, gradients all-reduced in several buckets launched from the backward
   pass) give the same loss curve — float64 to 1e-10 relative, float32 to 1e-6 at the first step
   (no update yet: only the summation order differs) and 1e-5 after 30 updates — and the same
   training and evaluation accuracies (token and sequence, periodic and at every length). The
   copy task scores a different number of positions in each row, so the ranks' shares of the
   mean loss differ: the all-reduced gradient must still be the single-process one. The same
   through the torchrun-style environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set by
   hand, one command per rank), and with --no-overlap.
2. Resume: a data-parallel run stopped at step 12 (--stop-at-step) and continued with --resume
   gives results.json and results.csv byte-identical to the uninterrupted data-parallel run.
3. A rank killed mid-run (SIGKILL): under --nproc, the command exits non-zero naming the rank
   within seconds (and a killed launcher takes its ranks with it); with ranks launched by hand, the surviving rank exits non-zero with the data-
   parallel error naming the failed collective, within the --timeout-s; a rank stopped (SIGSTOP,
   alive but silent) makes the other fail at the timeout.
4. Bad input: --nproc 0, a batch not divisible by the processes (--nproc 3, WORLD_SIZE=3), --nproc
   inside a launched rank: exit status 2 and a message naming the argument.

Prints PASS/FAIL per check and 'N passed, M failed' last; exits non-zero on any failure.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from phasor_check import report, summary

PHASOR = sys.argv[1] if len(sys.argv) > 1 else "phasor"
WORK = tempfile.mkdtemp(prefix="phasor_tasks_dp_")


def write_config(name, config):
    path = os.path.join(WORK, name + ".json")
    with open(path, "w") as f:
        json.dump(config, f)
    return path


PARITY = {
    "name": "dp_parity",
    "task": {"name": "parity", "train_lengths": [8], "eval_lengths": [4, 16], "eval_batch": 16},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "mlp_expansion": 1,
              "dtype": "float64"},
    "arms": [{"name": "gla", "model": {"mixer": "gla"}},
             {"name": "gdn", "model": {"mixer": "gated_deltanet"}}],
    "train": {"steps": 30, "batch_size": 8, "eval_every": 10, "checkpoint_every": 4,
              "log_every": 0},
    "lr_grid": [0.01],
    "seeds": [0],
}
COPY = {
    "name": "dp_copy",
    "task": {"name": "copy", "context": 40, "min_len": 1, "max_len": 8, "eval_lengths": [4, 8],
             "eval_batch": 16},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "mlp_expansion": 1},
    "arms": [{"name": "gdn", "model": {"mixer": "gated_deltanet"}}],
    "train": {"steps": 30, "batch_size": 8, "eval_every": 10, "log_every": 0},
    "lr_grid": [0.01],
    "seeds": [3],
}
LONG = dict(COPY, name="dp_long", train=dict(COPY["train"], steps=100000, eval_every=0,
                                             checkpoint_every=50))
parity_path = write_config("parity", PARITY)
copy_path = write_config("copy", COPY)
long_path = write_config("long", LONG)


def run(args, env=None, timeout=120):
    full_env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        full_env.pop(name, None)
    if env:
        full_env.update(env)
    return subprocess.run([PHASOR, "tasks", "run"] + args, capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def results(out):
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port):
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "LOCAL_RANK": str(rank)}


def start_ranks(config, out, world, extra=()):
    """The torchrun-style launch by hand: one `phasor tasks run` per rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ)
        env.update(rank_env(rank, world, port))
        procs.append(subprocess.Popen(
            [PHASOR, "tasks", "run", config, "--out", out, "--threads", "1", "--quiet"] +
            list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    return procs


def compare(name, single, parallel, first_tol, tol):
    """Loss curves to a relative tolerance (first step, all steps); accuracies equal."""
    a, b = results(single), results(parallel)
    ok, detail = True, []
    if b["machine"].get("processes") != 2 or "processes" in a["machine"]:
        ok = False
        detail.append(f"machine {a['machine']} / {b['machine']}")
    if len(a["runs"]) != len(b["runs"]):
        report(name, False, f"{len(a['runs'])} vs {len(b['runs'])} runs")
        return
    worst_first = worst = 0.0
    for ra, rb in zip(a["runs"], b["runs"]):
        label = ra["arm"]
        if len(ra["losses"]) != len(rb["losses"]) or ra["final_step"] != rb["final_step"]:
            ok = False
            detail.append(f"{label}: {len(ra['losses'])} vs {len(rb['losses'])} steps")
            continue
        rel = [abs(x - y) / max(abs(x), 1e-300) for x, y in zip(ra["losses"], rb["losses"])]
        worst_first = max(worst_first, rel[0])
        worst = max(worst, max(rel))
        if ra["train_accuracies"] != rb["train_accuracies"]:
            ok = False
            detail.append(f"{label}: training accuracies differ")
        for key in ("evals", "eval_by_length"):
            acc = lambda r: [(e.get("step", e.get("length")), e["token_accuracy"],
                              e["sequence_accuracy"]) for e in r[key]]
            if acc(ra) != acc(rb):
                ok = False
                detail.append(f"{label}: {key} accuracies differ: {acc(ra)} vs {acc(rb)}")
            loss_rel = max(abs(x["loss"] - y["loss"]) / abs(x["loss"])
                           for x, y in zip(ra[key], rb[key]))
            worst = max(worst, loss_rel)
    if worst_first > first_tol or worst > tol:
        ok = False
    detail.append(f"max relative loss difference: step 1 {worst_first:.2e} (≤ {first_tol:g}), "
                  f"all {worst:.2e} (≤ {tol:g})")
    report(name, ok, "; ".join(detail))
    if ok:
        print(f"     {detail[-1]}", flush=True)


# ---- 1. equality with the single-process run ----------------------------------------------------
t0 = time.time()
for config, tag, first_tol, tol, extra in (
        (parity_path, "parity float64, 2 arms", 1e-10, 1e-10, ["--bucket-mb", "0.001"]),
        (copy_path, "copy float32 (unequal scored positions per rank)", 1e-6, 1e-5,
         ["--bucket-mb", "0.002"]),
        (copy_path, "copy float32, one bucket after the backward (--no-overlap)", 1e-6, 1e-5,
         ["--no-overlap"])):
    single = os.path.join(WORK, "single_" + os.path.basename(config))
    if not os.path.exists(single):
        r = run([config, "--out", single, "--threads", "1", "--quiet"])
        if r.returncode != 0:
            report(f"single-process {tag}", False, r.stderr)
            continue
    parallel = os.path.join(WORK, "dp_" + str(time.time()))
    r = run([config, "--out", parallel, "--threads", "1", "--quiet", "--nproc", "2"] + extra)
    if r.returncode != 0:
        report(f"--nproc 2 {tag}", False, f"exit {r.returncode}: {r.stderr}")
        continue
    if "results:" not in r.stdout or r.stdout.count("sequence accuracy at the best lr") != 1:
        report(f"--nproc 2 {tag}: rank 0 alone prints the table", False, r.stdout)
    compare(f"--nproc 2 equals one process: {tag}", single, parallel, first_tol, tol)
    if "overlap" not in tag:
        with open(os.path.join(parallel, "timings.json")) as f:
            t = json.load(f)["runs"][0]["time_breakdown"]
        report(f"--nproc 2 {tag}: several buckets, launched from the backward pass",
               t.get("buckets", 0) > 1 and
               t.get("buckets_launched_in_backward") == t["buckets"] * t["steps"], str(t))
    else:
        with open(os.path.join(parallel, "timings.json")) as f:
            t = json.load(f)["runs"][0]["time_breakdown"]
        report(f"--nproc 2 {tag}: no bucket launched from the backward pass",
               t.get("buckets_launched_in_backward") == 0, str(t))

# The torchrun-style environment, one command per rank.
out = os.path.join(WORK, "by_hand")
procs = start_ranks(copy_path, out, 2)
outputs = [p.communicate(timeout=120) for p in procs]
codes = [p.returncode for p in procs]
if codes != [0, 0]:
    report("ranks launched by hand (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)", False,
           f"exit {codes}: {[o[1] for o in outputs]}")
else:
    report("ranks launched by hand: rank 1 prints nothing", outputs[1][0] == "", outputs[1][0])
    compare("ranks launched by hand equal one process: copy float32",
            os.path.join(WORK, "single_copy.json"), out, 1e-6, 1e-5)
print(f"     (equality checks: {time.time() - t0:.1f} s)", flush=True)

# ---- 2. resume under data parallelism -----------------------------------------------------------
whole = os.path.join(WORK, "resume_whole")
parts = os.path.join(WORK, "resume_parts")
r1 = run([parity_path, "--out", whole, "--threads", "1", "--quiet", "--nproc", "2"])
r2 = run([parity_path, "--out", parts, "--threads", "1", "--quiet", "--nproc", "2",
          "--stop-at-step", "12"])
stopped = None
if r2.returncode == 0:
    stopped = [run_["final_step"] for run_ in results(parts)["runs"]]
r3 = run([parity_path, "--out", parts, "--threads", "1", "--quiet", "--nproc", "2", "--resume"])
if any(r.returncode != 0 for r in (r1, r2, r3)):
    report("data-parallel resume", False, " / ".join(r.stderr for r in (r1, r2, r3)))
else:
    report("data-parallel run stopped at step 12", stopped == [12, 12], str(stopped))
    same = all(open(os.path.join(whole, n), "rb").read() == open(os.path.join(parts, n),
                                                                 "rb").read()
               for n in ("results.json", "results.csv"))
    report("data-parallel --resume: results.json and results.csv byte-identical to one go", same)

# ---- 3. a rank that dies ------------------------------------------------------------------------


def wait_for_checkpoint(out, procs, limit=60):
    """Until the first checkpoint is written (the ranks are training), or a process ended."""
    folder = os.path.join(out, "checkpoints")
    end = time.time() + limit
    while time.time() < end:
        if os.path.isdir(folder) and any(n.endswith(".ckpt") for n in os.listdir(folder)):
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.05)
    return False


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
                kids.append((int(env.get(b"RANK", b"-1")), int(entry)))
        except (OSError, ValueError, IndexError):
            pass
    return sorted(kids)


# --nproc: SIGKILL rank 1; the launcher stops rank 0 and exits non-zero, naming the rank.
out = os.path.join(WORK, "killed_nproc")
launcher = subprocess.Popen([PHASOR, "tasks", "run", long_path, "--out", out, "--threads", "1",
                             "--quiet", "--nproc", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
if not wait_for_checkpoint(out, [launcher]):
    launcher.kill()
    report("--nproc 2 with rank 1 killed", False, "the ranks did not start training")
else:
    kids = children_of(launcher.pid)
    victim = [pid for rank, pid in kids if rank == 1]
    if not victim:
        launcher.kill()
        report("--nproc 2 with rank 1 killed", False, f"no rank 1 among {kids}")
    else:
        os.kill(victim[0], signal.SIGKILL)
        killed_at = time.time()
        try:
            _, err = launcher.communicate(timeout=30)
            took = time.time() - killed_at
            report(f"--nproc 2 with rank 1 killed: non-zero exit naming the rank in {took:.1f} s",
                   launcher.returncode != 0 and "rank 1 of 2 failed" in err and took < 30,
                   f"exit {launcher.returncode}: {err}")
        except subprocess.TimeoutExpired:
            launcher.kill()
            report("--nproc 2 with rank 1 killed", False, "still running 30 s later")
# --nproc: SIGKILL the launcher; its ranks end too (no orphan keeps training and writing).
out = os.path.join(WORK, "killed_launcher")
launcher = subprocess.Popen([PHASOR, "tasks", "run", long_path, "--out", out, "--threads", "1",
                             "--quiet", "--nproc", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
if not wait_for_checkpoint(out, [launcher]):
    launcher.kill()
    report("--nproc 2 with the launcher killed", False, "the ranks did not start training")
else:
    kids = [pid for _, pid in children_of(launcher.pid)]
    launcher.kill()
    launcher.communicate()

    def running(pid):  # neither gone nor a zombie (reaped by whoever adopted it, or not)
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    end = time.time() + 20
    while time.time() < end and any(running(pid) for pid in kids):
        time.sleep(0.05)
    alive = [pid for pid in kids if running(pid)]
    report("--nproc 2 with the launcher killed: its ranks end", len(kids) == 2 and not alive,
           f"ranks {kids}, still alive {alive}")
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
# Ranks by hand (no launcher to stop the others): the survivor's collective fails.
for sig, name in ((signal.SIGKILL, "killed"), (signal.SIGSTOP, "stopped (alive, silent)")):
    out = os.path.join(WORK, "by_hand_" + name.split()[0])
    timeout_s = 4
    procs = start_ranks(long_path, out, 2, ["--timeout-s", str(timeout_s)])
    if not wait_for_checkpoint(out, procs):
        for p in procs:
            p.kill()
        report(f"rank 1 {name}", False, "the ranks did not start training")
        continue
    os.kill(procs[1].pid, sig)
    killed_at = time.time()
    try:
        _, err = procs[0].communicate(timeout=timeout_s + 30)
        took = time.time() - killed_at
        report(f"rank 1 {name}: rank 0 fails with the data-parallel error in {took:.1f} s "
               f"(timeout {timeout_s} s)",
               procs[0].returncode == 1 and "data parallel: the all-reduce" in err and
               "failed on rank 0 of 2" in err and took < timeout_s + 20,
               f"exit {procs[0].returncode}: {err}")
    except subprocess.TimeoutExpired:
        procs[0].kill()
        report(f"rank 1 {name}", False, "rank 0 still running")
    procs[1].kill()
    procs[1].communicate()

# ---- 4. bad input -------------------------------------------------------------------------------
bad = [
    ("--nproc 0", [parity_path, "--out", os.path.join(WORK, "bad"), "--nproc", "0"], None,
     "argument '--nproc': expected a number of processes ≥ 1, got 0"),
    ("--nproc 3 with batch_size 8", [parity_path, "--out", os.path.join(WORK, "bad"), "--nproc",
                                     "3"], None,
     "argument '--nproc': expected a number of processes dividing config.train.batch_size = 8"),
    ("WORLD_SIZE=3 with batch_size 8", [parity_path, "--out", os.path.join(WORK, "bad")],
     rank_env(0, 3, free_port()),
     "environment WORLD_SIZE: expected a number of processes dividing "
     "config.train.batch_size = 8"),
    ("--nproc inside a rank", [parity_path, "--out", os.path.join(WORK, "bad"), "--nproc", "2"],
     rank_env(0, 2, free_port()), "argument '--nproc': expected no launch environment"),
    ("--timeout-s 0", [parity_path, "--out", os.path.join(WORK, "bad"), "--timeout-s", "0"], None,
     "argument '--timeout-s': expected seconds in (0, 10^6]"),
]
for name, args, env, message in bad:
    r = run(args, env=env, timeout=60)
    report(f"bad input: {name}", r.returncode == 2 and message in r.stderr and
           not os.path.exists(os.path.join(WORK, "bad")), f"exit {r.returncode}: {r.stderr}")

sys.exit(summary())
