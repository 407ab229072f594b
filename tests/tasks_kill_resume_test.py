#!/usr/bin/env python3
"""Crash safety of `phasor tasks run`: SIGKILLs at random moments, --resume, bit-identical results.

    python3 tasks_kill_resume_test.py <path to the phasor executable> [--seed N] [--kills N]

1. Runs a tiny grid (parity; 2 arms x 1 lr x 2 seeds; a checkpoint every 4 steps) in one go.
2. Runs the same grid into another folder and kills the process with SIGKILL --kills times
   (default 24, at least 20), restarting it with --resume after each kill. The kills follow a
   plan drawn from --seed (where they land depends on the timing, too):
   - write kills: every write of the harness sleeps PHASOR_TASKS_WRITE_DELAY_MS between its
     complete temporary file "<name>.tmp.<pid>" and the rename (the test hook of
     tasks/include/phasor/tasks/files.h). The script watches the output folder and kills the
     process as soon as the chosen write's temporary file appears (the n-th checkpoint write from
     now, a run record, results.json), so that the kill lands inside that write with certainty;
     the temporary file still being there after the kill proves it;
   - random kills: after a random delay from the start of the process (without the write delay:
     these meet the harness's real timing, landing in training, evaluation, start-up or a write),
     but no later than the 1st to 5th checkpoint or record the invocation completes (watched in
     the folder), so that however loaded the machine, the grid is not finished by a few kills.
3. A last --resume without kill finishes the grid. Its results.json and results.csv must equal
   the uninterrupted run's byte for byte (so must the PNG plots), and no temporary file may be
   left behind (the runner removes those of killed writers).

Prints every kill (after how long, where it landed: during which write, or elsewhere) and a
summary; 'N passed, M failed' last; exits non-zero on any failure.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from phasor_check import report, summary

parser = argparse.ArgumentParser()
parser.add_argument("phasor", nargs="?", default="phasor")
parser.add_argument("--seed", type=int, default=14)
parser.add_argument("--kills", type=int, default=24)
args = parser.parse_args()
if args.kills < 20:
    sys.exit("tasks_kill_resume_test.py: --kills must be at least 20")

WORK = tempfile.mkdtemp(prefix="phasor_tasks_kill_resume_")
WRITE_DELAY_MS = 100  # the window a write kill aims at (between the temporary file and the rename)
CONFIG = {
    "name": "kill_resume",
    "task": {"name": "parity", "train_lengths": [8], "eval_lengths": [4, 16], "eval_batch": 16},
    "model": {"hidden_size": 16, "num_layers": 1, "num_heads": 1, "mlp_expansion": 1},
    "arms": [{"name": "gla", "model": {"mixer": "gla"}},
             {"name": "gdn", "model": {"mixer": "gated_deltanet"}}],
    "train": {"steps": 100, "batch_size": 4, "eval_every": 20, "checkpoint_every": 4,
              "log_every": 0},
    "lr_grid": [0.01],
    "seeds": [0, 1],
}
COMPARED = ("results.json", "results.csv", "accuracy_vs_length.png",
            "token_accuracy_vs_length.png", "loss.png")


config_path = os.path.join(WORK, "config.json")
with open(config_path, "w") as f:
    json.dump(CONFIG, f)


def start(out, delay_ms=0):
    env = dict(os.environ)
    env.pop("PHASOR_TASKS_WRITE_DELAY_MS", None)
    if delay_ms:
        env["PHASOR_TASKS_WRITE_DELAY_MS"] = str(delay_ms)
    return subprocess.Popen([args.phasor, "tasks", "run", config_path, "--out", out, "--resume",
                             "--threads", "1", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def temp_files(out, pid=None):
    """The temporary files "<name>.tmp.<pid>" in the output folder and its checkpoints/."""
    found = []
    for folder in (out, os.path.join(out, "checkpoints")):
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            m = re.fullmatch(r"(.+)\.tmp\.(\d+)", name)
            if m and (pid is None or int(m.group(2)) == pid):
                found.append(os.path.join(folder, name))
    return found


def renamed_files(out):
    """The checkpoints and run records in checkpoints/ with their inode: a rename of a new
    version over one gives it a new inode, which tells the script that a write completed."""
    folder = os.path.join(out, "checkpoints")
    stamps = {}
    try:
        with os.scandir(folder) as entries:
            for e in entries:
                if e.name.endswith((".ckpt", ".json")):
                    try:
                        stamps[e.name] = e.inode()
                    except FileNotFoundError:
                        pass
    except FileNotFoundError:
        pass
    return stamps


def kind_of(temp_path):
    """What a temporary file was going to become: checkpoint, run record or a results file."""
    name = re.sub(r"\.tmp\.\d+$", "", os.path.basename(temp_path))
    if name.endswith(".ckpt"):
        return "checkpoint"
    if os.path.basename(os.path.dirname(temp_path)) == "checkpoints":
        return "run record"
    return name  # results.json, results.csv, timings.json, table.txt, *.png


def progress(out):
    """Finished runs and checkpoints on disk."""
    folder = os.path.join(out, "checkpoints")
    if not os.path.isdir(folder):
        return "nothing on disk"
    names = os.listdir(folder)
    records = sum(1 for n in names if n.endswith(".json"))
    ckpts = sum(1 for n in names if n.endswith(".ckpt"))
    return f"{records}/4 runs finished, {ckpts} checkpoints"


def finish(proc, timeout=300):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return -1, out.decode(errors="replace"), "timed out\n" + err.decode(errors="replace")
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# ---- 1. the uninterrupted run ------------------------------------------------------------------
reference = os.path.join(WORK, "uninterrupted")
t0 = time.monotonic()
rc, stdout, stderr = finish(start(reference))
uninterrupted_s = time.monotonic() - t0
report("uninterrupted run", rc == 0, stdout + stderr)
if rc != 0:
    summary()
    sys.exit(1)
# The start-up (and the end: records read back, results written) of an invocation with nothing
# left to train, which the random kills' delays are measured against.
t0 = time.monotonic()
rc, stdout, stderr = finish(start(reference))
startup_s = time.monotonic() - t0
report("a finished grid resumes to nothing", rc == 0, stdout + stderr)
print(f"uninterrupted: {uninterrupted_s:.1f} s; an invocation with nothing to train: "
      f"{startup_s:.1f} s", flush=True)

# ---- 2. the killed and resumed run -------------------------------------------------------------
# Kills until --kills of them have landed: checkpoint-write kills (aimed at the `skip`+1-th
# checkpoint write from the start, skip drawn from 0..8) alternating with random ones, the 7th kill
# aimed at a run record's write and the last but one at results.json's; once every run has
# finished there are no checkpoint writes left to aim at, and random kills take their turns. An
# invocation that finishes before its kill is not counted as a kill.
rng = random.Random(args.seed)
training_s = max(uninterrupted_s - startup_s, 0.5)
killed = os.path.join(WORK, "killed")


def grid_finished():
    folder = os.path.join(killed, "checkpoints")
    return os.path.isdir(folder) and sum(n.endswith(".json") for n in os.listdir(folder)) == 4


landed = {}
write_kills = 0
write_kills_confirmed = 0
kills = 0
completed_early = 0
attempt = 0
while kills < args.kills and attempt < 3 * args.kills:
    attempt += 1
    skip = 0
    if kills == args.kills - 2:
        target = "results.json"
    elif kills == 6 and not grid_finished():
        target = "run record"
    elif kills % 2 == 0 and not grid_finished():
        target, skip = "checkpoint", rng.randint(0, 8)
    else:
        target, skip = "random", None
    # The write delay only where a kill aims at a write: random kills meet the real timing.
    proc = start(killed, WRITE_DELAY_MS if target != "random" else 0)
    began = time.monotonic()
    if target == "random":
        # From the middle of the start-up (mostly loading LibTorch) to half the training past
        # it, cut at the limit-th completed write: the kills land in the start-up, the training,
        # evaluations or writes, and the grid still needs many invocations to finish.
        delay = rng.uniform(0.5 * startup_s, startup_s + 0.5 * training_s)
        limit = rng.randint(1, 5)
        stamps, completed = renamed_files(killed), 0
        while proc.poll() is None and time.monotonic() - began < delay and completed < limit:
            now = renamed_files(killed)
            completed += sum(1 for name, inode in now.items() if stamps.get(name) != inode)
            stamps = now
            time.sleep(0.002)
    else:
        seen = set()
        appearances = 0
        deadline = began + 120
        while proc.poll() is None and time.monotonic() < deadline:
            present = {p for p in temp_files(killed, proc.pid) if kind_of(p) == target}
            appearances += len(present - seen)
            seen = present
            if appearances > skip:
                break
            time.sleep(0.002)
    if proc.poll() is not None:  # it finished (or failed) before the kill
        rc, stdout, stderr = finish(proc)
        report(f"attempt {attempt}: an invocation that ends by itself succeeds", rc == 0,
               stdout + stderr)
        completed_early += 1
        print(f"attempt {attempt:2d} ({target}): the invocation finished first "
              f"({progress(killed)})", flush=True)
        continue
    os.kill(proc.pid, signal.SIGKILL)
    after = time.monotonic() - began
    proc.wait()
    proc.stdout.close()
    proc.stderr.close()
    kills += 1
    leftovers = temp_files(killed, proc.pid)
    where = ("during the write of " + ", ".join(sorted(kind_of(p) for p in leftovers))
             if leftovers else "elsewhere")
    key = "during a " + kind_of(leftovers[0]) + " write" if leftovers else "elsewhere"
    landed[key] = landed.get(key, 0) + 1
    if target != "random":
        confirmed = any(kind_of(p) == target for p in leftovers)
        write_kills += 1
        write_kills_confirmed += confirmed
        report(f"kill {kills}: lands inside a {target} write", confirmed, where)
    print(f"kill {kills:2d} ({target}{'' if skip is None else f', write #{skip + 1}'}) after "
          f"{after:.2f} s: {where} ({progress(killed)})", flush=True)

# ---- 3. the last resume and the comparison ------------------------------------------------------
rc, stdout, stderr = finish(start(killed))
report("last --resume finishes", rc == 0, stdout + stderr)
for name in COMPARED:
    a, b = os.path.join(reference, name), os.path.join(killed, name)
    same = os.path.exists(a) and os.path.exists(b) and read_bytes(a) == read_bytes(b)
    report(f"{name} byte-identical to the uninterrupted run's", same,
           f"{os.path.getsize(a) if os.path.exists(a) else 'missing'} vs "
           f"{os.path.getsize(b) if os.path.exists(b) else 'missing'} bytes ({a}, {b})")
left = temp_files(killed)
report("no temporary file left", not left, ", ".join(left))
report(f"{args.kills} kills ({kills})", kills == args.kills,
       f"{completed_early} invocations ended first")
checkpoint_kills = landed.get("during a checkpoint write", 0)
report(f"at least 5 kills inside checkpoint writes ({checkpoint_kills})", checkpoint_kills >= 5)
with open(os.path.join(killed, "timings.json")) as f:
    timings = json.load(f)
report("timings.json says which runs were resumed", any(r.get("resumed") for r in timings["runs"]),
       json.dumps(timings["runs"]))

print(f"{kills} kills: " + ", ".join(f"{n} {k}" for k, n in sorted(landed.items())) +
      f"; {write_kills_confirmed} of {write_kills} write kills confirmed inside their write; "
      f"{completed_early} invocations finished before their kill")
sys.exit(summary())
