#!/usr/bin/env python3
"""`phasor op ... --context-parallel N` against the same command on one process.

    python3 cli_context_parallel_test.py <path to the phasor executable>

For each case, writes inputs with torch.save, runs `phasor op` once on one process and once split
across N local ranks (2, 3, 4: N processes over c10d/Gloo on the loopback, each holding a
contiguous slice of the tokens), and requires the same outputs and gradients: float64 inputs to
1e-12 relative RMS, float32 to 1e-5. Cases cover GLA, Gated DeltaNet and FoX, forward and
backward (with `do`, and `dht` for the final state), initial states, rotation angles, varlen
batches whose sequences straddle rank boundaries, windows, and T not divisible by N. Also checks
that bad use exits with status 2 naming the argument. Prints 'N passed, M failed' last and exits
non-zero on any failure.
"""
import math
import os
import sys
import tempfile

import torch

import phasor_check
from phasor_check import report, summary, rel_rms

PHASOR = sys.argv[1] if len(sys.argv) > 1 else "phasor"
WORK = tempfile.mkdtemp(prefix="phasor_cp_cli_")


def run_phasor(args, in_path, tag):
    return phasor_check.run_phasor(PHASOR, ["op", *args, "--in", in_path, "--threads", "1"],
                                   os.path.join(WORK, f"out_{tag}.pt"), timeout=120)


def case(name, op_args, inputs, ranks=(2, 3)):
    in_path = os.path.join(WORK, "in.pt")
    torch.save(inputs, in_path)
    status, err, single = run_phasor(op_args, in_path, "single")
    if status != 0:
        report(name, False, f"single process exited {status}: {err.strip()}")
        return
    tolerance = 1e-12 if inputs["q"].dtype == torch.float64 else 1e-5
    for n in ranks:
        status, err, split = run_phasor([*op_args, "--context-parallel", str(n)], in_path, "cp")
        label = f"{name} [{n} ranks]"
        if status != 0:
            report(label, False, f"exited {status}: {err.strip()[-2000:]}")
            continue
        if sorted(split.keys()) != sorted(single.keys()):
            report(label, False, f"keys {sorted(split.keys())} != {sorted(single.keys())}")
            continue
        worst = max(((key, rel_rms(split[key], single[key])) for key in single),
                    key=lambda item: item[1])
        shapes_ok = all(split[k].shape == single[k].shape for k in single)
        report(label, shapes_ok and worst[1] <= tolerance,
               f"worst {worst[0]}: relative RMS {worst[1]:.3g} > {tolerance:g}"
               if shapes_ok else "shapes differ")


def bad(name, op_args, inputs, expected_fragment):
    in_path = os.path.join(WORK, "in_bad.pt")
    torch.save(inputs, in_path)
    status, err, _ = run_phasor(op_args, in_path, "bad")
    report(name, status == 2 and expected_fragment in err,
           f"status {status}, stderr: {err.strip()[-500:]}")


def linear_inputs(B, T, H, K, V, dtype, gdn=False, HV=None, theta=False, h0=False, cu=None,
                  backward=True, final=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    HV = HV or H
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    x = {"q": r(B, T, H, K), "k": r(B, T, H, K) / math.sqrt(K), "v": r(B, T, HV, V)}
    N = B if cu is None else len(cu) - 1
    if gdn:
        x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
        x["g"] = -torch.rand(B, T, HV, generator=gen, dtype=dtype) * 0.5
        x["beta"] = torch.rand(B, T, HV, generator=gen, dtype=dtype)
    else:
        x["g"] = -torch.rand(B, T, H, K, generator=gen, dtype=dtype) * 0.5
    if theta:
        x["theta"] = torch.cumsum(torch.rand(B, T, H, K // 2, generator=gen, dtype=dtype), 1)
    if h0:
        x["initial_state"] = r(N, HV, K, V)
    if cu is not None:
        x["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    if backward:
        x["do"] = r(B, T, HV, V)
        if final:
            x["dht"] = r(N, HV, K, V)
    return x


def fox_inputs(T, HQ, H, K, V, dtype, theta=False, cu=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    x = {"q": r(1, T, HQ, K), "k": r(1, T, H, K), "v": r(1, T, H, V),
         "g": -torch.rand(1, T, HQ, generator=gen, dtype=dtype) * 0.3, "do": r(1, T, HQ, V)}
    if theta:
        x["theta"] = torch.cumsum(torch.rand(1, T, H, K // 2, generator=gen, dtype=dtype), 1)
    if cu is not None:
        x["cu_seqlens"] = torch.tensor(cu, dtype=torch.int64)
    return x


f64, f32 = torch.float64, torch.float32
# GLA
case("gla chunk f64, h0 + dht, T=37", ["chunk_gla", "--chunk-size", "8", "--output-final-state"],
     linear_inputs(2, 37, 2, 6, 5, f64, h0=True, final=True), ranks=(2, 3, 4))
case("gla recurrent f64, theta", ["fused_recurrent_gla", "--output-final-state"],
     linear_inputs(1, 29, 2, 8, 4, f64, theta=True, h0=True, final=True))
case("gla chunk f32, varlen straddling", ["chunk_gla", "--chunk-size", "16",
                                          "--output-final-state"],
     linear_inputs(1, 50, 2, 8, 8, f32, cu=[0, 7, 7, 31, 50], h0=True, final=True))
case("gla forward only f64", ["chunk_gla"], linear_inputs(1, 23, 1, 4, 6, f64, backward=False))
# Gated DeltaNet
case("gdn chunk f64, HV=2H, h0 + dht", ["chunk_gated_delta_rule", "--chunk-size", "8",
                                        "--output-final-state"],
     linear_inputs(1, 41, 1, 6, 5, f64, gdn=True, HV=2, h0=True, final=True), ranks=(2, 3, 4))
case("gdn recurrent f64, varlen, theta, l2norm",
     ["fused_recurrent_gated_delta_rule", "--use-qk-l2norm", "--output-final-state"],
     linear_inputs(1, 33, 2, 8, 4, f64, gdn=True, theta=True, cu=[0, 5, 20, 33], final=True))
case("gdn chunk f32", ["chunk_gated_delta_rule", "--chunk-size", "16"],
     linear_inputs(2, 40, 2, 16, 16, f32, gdn=True))
# FoX
case("fox chunk f64, GQA, theta", ["parallel_forgetting_attn", "--chunk-size", "8"],
     fox_inputs(35, 4, 2, 8, 6, f64, theta=True), ranks=(2, 3, 4))
case("fox chunk f64, window 6, varlen", ["forgetting_attn", "--window-size", "6"],
     fox_inputs(30, 2, 2, 4, 4, f64, cu=[0, 11, 11, 30]))
case("fox chunk f32", ["forgetting_attn"], fox_inputs(40, 2, 1, 16, 16, f32))

# Bad use
bad("--context-parallel 0", ["gla", "--context-parallel", "0"],
    linear_inputs(1, 8, 1, 4, 4, f64, backward=False), "'--context-parallel'")
bad("--context-parallel with --device emulated",
    ["gla", "--context-parallel", "2", "--device", "emulated"],
    linear_inputs(1, 8, 1, 4, 4, f64, backward=False), "'--context-parallel'")
bad_shape = linear_inputs(1, 8, 1, 4, 4, f64)
bad_shape["do"] = bad_shape["do"][:, :5]
bad("do with the wrong T", ["gla", "--context-parallel", "2"], bad_shape, "'do'")

sys.exit(summary())
