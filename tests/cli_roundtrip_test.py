#!/usr/bin/env python3
"""Round trip through the `phasor op` command and Python's torch.

    python3 cli_roundtrip_test.py <path to the phasor executable>

Writes inputs with torch.save, runs `phasor op` for each op and implementation, loads the result
with torch.load and compares it with an independent pure-PyTorch float64 implementation of each
recurrence written below (straight from the equations in include/phasor/*.h): outputs, final
states, and, when the input holds `do` / `dht`, the gradients torch.autograd computes on that
implementation. Also checks that bad input exits with status 2 and a message naming the argument.
Prints 'N passed, M failed' last and exits non-zero on any failure.
"""
import os
import subprocess
import sys
import tempfile

import torch

import phasor_check
from phasor_check import report, summary, rel_rms

PHASOR = sys.argv[1] if len(sys.argv) > 1 else "phasor"
WORK = tempfile.mkdtemp(prefix="phasor_cli_")
IMPLS = ("reference", "recurrent", "chunk")


def run_phasor(args, inputs):
    """Saves `inputs`, runs `phasor op *args`, returns (exit status, stderr, outputs or None)."""
    in_path = os.path.join(WORK, "in.pt")
    torch.save(inputs, in_path)
    return phasor_check.run_phasor(PHASOR, ["op", *args, "--in", in_path],
                                   os.path.join(WORK, "out.pt"), timeout=60)


# ---- independent float64 implementations -----------------------------------------------------------

def sequences(B, T, cu_seqlens):
    """(batch row, start, end) of each sequence: the B rows, or the packed cu_seqlens ranges."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    cu = cu_seqlens.tolist()
    return [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]


def assemble(rows, B, T):
    """rows[(b, t)] = tensor per token → [B, T, ...]."""
    return torch.stack([torch.stack([rows[(b, t)] for t in range(T)]) for b in range(B)])


def gla_ref(q, k, v, g, scale=None, initial_state=None, cu_seqlens=None):
    """S_t = diag(exp(g_t)) S_{t−1} + k_t v_tᵀ;  o_t = S_tᵀ (scale · q_t)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    rows, finals = {}, []
    for n, (b, start, end) in enumerate(sequences(B, T, cu_seqlens)):
        S = initial_state[n] if initial_state is not None else q.new_zeros(H, K, V)
        for t in range(start, end):
            S = torch.exp(g[b, t])[:, :, None] * S + k[b, t][:, :, None] * v[b, t][:, None, :]
            rows[(b, t)] = torch.einsum("hk,hkv->hv", scale * q[b, t], S)
        finals.append(S)
    return assemble(rows, B, T), torch.stack(finals)


def l2norm(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gated_delta_rule_ref(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None,
                         use_qk_l2norm=False):
    """S' = exp(g_t) S_{t−1};  S_t = S' + β_t k_t (v_t − S'ᵀ k_t)ᵀ;  o_t = S_tᵀ (scale · q_t).
    Value head hv reads q/k head hv // (HV / H)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q.repeat_interleave(HV // H, dim=2)
    k = k.repeat_interleave(HV // H, dim=2)
    rows, finals = {}, []
    for n, (b, start, end) in enumerate(sequences(B, T, cu_seqlens)):
        S = initial_state[n] if initial_state is not None else q.new_zeros(HV, K, V)
        for t in range(start, end):
            S = torch.exp(g[b, t])[:, None, None] * S
            prediction = torch.einsum("hk,hkv->hv", k[b, t], S)
            S = S + beta[b, t][:, None, None] * k[b, t][:, :, None] * (v[b, t] - prediction)[:, None, :]
            rows[(b, t)] = torch.einsum("hk,hkv->hv", scale * q[b, t], S)
        finals.append(S)
    return assemble(rows, B, T), torch.stack(finals)


def forgetting_attn_ref(q, k, v, g, scale=None, window_size=None, cu_seqlens=None):
    """o_i = Σ_{j ≤ i, i − j < window} softmax_j(scale · q_i·k_j + Σ_{j < l ≤ i} g_l) v_j.
    Query head hq reads key/value head hq // (HQ / H). The gate sums are formed directly (no
    difference of cumulative sums), so −inf gates give −inf, not NaN."""
    B, T, HQ, K = q.shape
    H = k.shape[2]
    scale = K ** -0.5 if scale is None else scale
    k = k.repeat_interleave(HQ // H, dim=2)
    v = v.repeat_interleave(HQ // H, dim=2)
    rows = {}
    for b, start, end in sequences(B, T, cu_seqlens):
        L = end - start
        if L == 0:
            continue
        i = torch.arange(L)[:, None, None]
        j = torch.arange(L)[None, :, None]
        l = torch.arange(L)[None, None, :]
        between = (j < l) & (l <= i)  # [L, L, L]: gate l lies in (j, i]
        gs = g[b, start:end]  # [L, HQ]
        decay = torch.where(between[..., None], gs[None, None, :, :],
                            torch.zeros((), dtype=gs.dtype)).sum(2)  # [L, L, HQ]
        logits = scale * torch.einsum("ihk,jhk->ijh", q[b, start:end], k[b, start:end]) + decay
        visible = j[..., 0] <= i[..., 0]
        if window_size is not None:
            visible = visible & (i[..., 0] - j[..., 0] < window_size)
        logits = logits.masked_fill(~visible[..., None], float("-inf"))
        p = torch.softmax(logits, dim=1)
        o = torch.einsum("ijh,jhv->ihv", p, v[b, start:end])
        for t in range(L):
            rows[(b, start + t)] = o[t]
    return assemble(rows, B, T)


# ---- inputs --------------------------------------------------------------------------------------------

def log_gates(shape, mean=2.0):
    """log σ(x), x ~ N(mean, 1): forget gates around σ(mean)."""
    return torch.nn.functional.logsigmoid(torch.randn(shape, dtype=torch.float64) + mean)


def cu(lengths):
    return torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)


def reference_grads(forward, inputs, names, outputs, grad_outputs):
    """Gradients of Σ⟨outputs, grad_outputs⟩ with respect to inputs[names] (float64 autograd)."""
    leaves = {n: inputs[n].double().clone().requires_grad_(True) for n in names}
    outs = forward(leaves)
    outs = [outs[i] for i in outputs]
    grads = torch.autograd.grad(outs, [leaves[n] for n in names], grad_outputs=grad_outputs,
                                allow_unused=True)
    return {n: (gr if gr is not None else torch.zeros_like(leaves[n])) for n, gr in zip(names, grads)}


def compare(name, outputs, expected, tol):
    """Every expected key must be present with matching shape and rel-RMS error ≤ tol."""
    if outputs is None:
        report(name, False, "no output")
        return
    problems = []
    for key, value in expected.items():
        if key not in outputs:
            problems.append(f"missing '{key}'")
            continue
        got = outputs[key]
        if tuple(got.shape) != tuple(value.shape):
            problems.append(f"{key}: shape {tuple(got.shape)} != {tuple(value.shape)}")
            continue
        err = rel_rms(got, value)
        if not (err <= tol):
            problems.append(f"{key}: rel RMS error {err:.3e} > {tol:.0e}")
    unexpected = set(outputs) - set(expected)
    if unexpected:
        problems.append(f"unexpected keys {sorted(unexpected)}")
    report(name, not problems, "; ".join(problems))


def expect_dtype(name, outputs, key, dtype):
    ok = outputs is not None and key in outputs and outputs[key].dtype == dtype
    report(name, ok, f"{key} dtype {outputs[key].dtype if ok or (outputs and key in outputs) else None} != {dtype}")


# ---- GLA ---------------------------------------------------------------------------------------------------

def test_gla():
    torch.manual_seed(1)
    B, T, H, K, V = 2, 13, 2, 5, 6
    x = {"q": torch.randn(B, T, H, K, dtype=torch.float64),
         "k": torch.randn(B, T, H, K, dtype=torch.float64),
         "v": torch.randn(B, T, H, V, dtype=torch.float64),
         "g": log_gates((B, T, H, K)),
         "initial_state": torch.randn(B, H, K, V, dtype=torch.float64)}
    x["do"] = torch.randn(B, T, H, V, dtype=torch.float64)
    x["dht"] = torch.randn(B, H, K, V, dtype=torch.float64)
    fwd = lambda a: gla_ref(a["q"], a["k"], a["v"], a["g"], None, a["initial_state"])
    o, ht = fwd(x)
    names = ["q", "k", "v", "g", "initial_state"]
    grads = reference_grads(fwd, x, names, [0, 1], [x["do"], x["dht"]])
    expected = {"o": o, "final_state": ht, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"],
                "dg": grads["g"], "dh0": grads["initial_state"]}
    for impl in IMPLS:
        rc, err, out = run_phasor(["gla", "--impl", impl, "--chunk-size", "4",
                                   "--output-final-state"], x)
        compare(f"gla {impl} float64 fwd+bwd with states", out, expected, 1e-9)
        if rc != 0:
            print(err)

    # float32 inputs through the fla name (chunk), a non-default scale; o keeps float32.
    x32 = {key: value.float() for key, value in x.items() if key not in ("initial_state", "dht")}
    x32["g"] = x32["g"].float()
    fwd = lambda a: gla_ref(a["q"], a["k"], a["v"], a["g"], 0.3)
    o, _ = fwd(x32)
    grads = reference_grads(fwd, x32, ["q", "k", "v", "g"], [0], [x32["do"].double()])
    _, _, out = run_phasor(["chunk_gla", "--scale", "0.3", "--chunk-size", "8"], x32)
    compare("chunk_gla float32 fwd+bwd, scale 0.3", out,
            {"o": o, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"], "dg": grads["g"]}, 1e-4)
    expect_dtype("chunk_gla float32 in, float32 out", out, "o", torch.float32)

    # Packed sequences, one of them empty and one a single token.
    lengths = [4, 0, 7, 1]
    N, packed = len(lengths), sum(lengths)
    y = {"q": torch.randn(1, packed, H, K, dtype=torch.float64),
         "k": torch.randn(1, packed, H, K, dtype=torch.float64),
         "v": torch.randn(1, packed, H, V, dtype=torch.float64),
         "g": log_gates((1, packed, H, K)),
         "initial_state": torch.randn(N, H, K, V, dtype=torch.float64),
         "cu_seqlens": cu(lengths),
         "do": torch.randn(1, packed, H, V, dtype=torch.float64),
         "dht": torch.randn(N, H, K, V, dtype=torch.float64)}
    fwd = lambda a: gla_ref(a["q"], a["k"], a["v"], a["g"], None, a["initial_state"], y["cu_seqlens"])
    o, ht = fwd(y)
    grads = reference_grads(fwd, y, names, [0, 1], [y["do"], y["dht"]])
    expected = {"o": o, "final_state": ht, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"],
                "dg": grads["g"], "dh0": grads["initial_state"]}
    for impl in IMPLS:
        _, _, out = run_phasor(["gla", "--impl", impl, "--chunk-size", "3",
                                "--output-final-state"], y)
        compare(f"gla {impl} varlen (empty sequence) fwd+bwd", out, expected, 1e-9)

    # Strong gates (−20 per channel) and gates of exactly 0 (g = −inf), forward only.
    z = {key: x[key] for key in ("q", "k", "v")}
    g = log_gates((B, T, H, K))
    g[:, 3] = -20.0
    g[0, 6, 0, 1] = float("-inf")
    g[1, 9] = float("-inf")
    z["g"] = g
    o, ht = gla_ref(z["q"], z["k"], z["v"], z["g"])
    for name in ("fused_recurrent_gla", "chunk_gla"):
        _, _, out = run_phasor([name, "--output-final-state", "--chunk-size", "4"], z)
        compare(f"{name} strong and zero gates, forward", out, {"o": o, "final_state": ht}, 1e-9)

    # float16 inputs: computed in float32, o cast back to float16.
    h = {key: x[key].half() for key in ("q", "k", "v", "g")}
    o, _ = gla_ref(*(h[key].double() for key in ("q", "k", "v", "g")))
    _, _, out = run_phasor(["gla"], h)
    compare("gla float16 inputs, forward", out, {"o": o}, 2e-3)
    expect_dtype("gla float16 in, float16 out", out, "o", torch.float16)


# ---- Gated DeltaNet -------------------------------------------------------------------------------------

def test_gated_delta_rule():
    torch.manual_seed(2)
    B, T, H, HV, K, V = 2, 11, 1, 2, 4, 5
    x = {"q": torch.randn(B, T, H, K, dtype=torch.float64),
         "k": torch.randn(B, T, H, K, dtype=torch.float64),
         "v": torch.randn(B, T, HV, V, dtype=torch.float64),
         "g": log_gates((B, T, HV), mean=3.0),
         "beta": 2 * torch.rand(B, T, HV, dtype=torch.float64),
         "initial_state": torch.randn(B, HV, K, V, dtype=torch.float64),
         "do": torch.randn(B, T, HV, V, dtype=torch.float64),
         "dht": torch.randn(B, HV, K, V, dtype=torch.float64)}
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    fwd = lambda a: gated_delta_rule_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], None,
                                         a["initial_state"], None, True)
    o, ht = fwd(x)
    grads = reference_grads(fwd, x, names, [0, 1], [x["do"], x["dht"]])
    expected = {"o": o, "final_state": ht, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"],
                "dg": grads["g"], "dbeta": grads["beta"], "dh0": grads["initial_state"]}
    for impl in IMPLS:
        _, _, out = run_phasor(["gated_delta_rule", "--impl", impl, "--chunk-size", "4",
                                "--output-final-state", "--use-qk-l2norm"], x)
        compare(f"gated_delta_rule {impl} float64 grouped heads, l2norm, fwd+bwd", out,
                expected, 1e-9)

    # Packed sequences (one empty), no l2 norm, unit-norm-ish keys so the delta rule is stable.
    lengths = [5, 0, 6]
    N, T = len(lengths), sum(lengths)
    y = {"q": torch.randn(1, T, H, K, dtype=torch.float64),
         "k": l2norm(torch.randn(1, T, H, K, dtype=torch.float64)),
         "v": torch.randn(1, T, HV, V, dtype=torch.float64),
         "g": log_gates((1, T, HV)),
         "beta": torch.rand(1, T, HV, dtype=torch.float64),
         "initial_state": torch.randn(N, HV, K, V, dtype=torch.float64),
         "cu_seqlens": cu(lengths),
         "do": torch.randn(1, T, HV, V, dtype=torch.float64),
         "dht": torch.randn(N, HV, K, V, dtype=torch.float64)}
    fwd = lambda a: gated_delta_rule_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], None,
                                         a["initial_state"], y["cu_seqlens"])
    o, ht = fwd(y)
    grads = reference_grads(fwd, y, names, [0, 1], [y["do"], y["dht"]])
    expected = {"o": o, "final_state": ht, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"],
                "dg": grads["g"], "dbeta": grads["beta"], "dh0": grads["initial_state"]}
    for impl in IMPLS:
        _, _, out = run_phasor(["gated_delta_rule", "--impl", impl, "--chunk-size", "2",
                                "--output-final-state"], y)
        compare(f"gated_delta_rule {impl} varlen (empty sequence) fwd+bwd", out, expected, 1e-9)

    # float32 through the fla names, with −inf and −20 gates; forward and backward without states.
    z = {key: x[key].float() for key in ("q", "k", "v", "g", "beta", "do")}
    z["g"][0, 4] = float("-inf")
    z["g"][1, 2:4] = -20.0
    fwd = lambda a: gated_delta_rule_ref(a["q"], a["k"], a["v"], a["g"], a["beta"], 0.5, None,
                                         None, True)
    o, _ = fwd(z)
    grads = reference_grads(fwd, z, ["q", "k", "v", "g", "beta"], [0], [z["do"].double()])
    expected = {"o": o, "dq": grads["q"], "dk": grads["k"], "dv": grads["v"], "dg": grads["g"],
                "dbeta": grads["beta"]}
    for name in ("fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule"):
        _, _, out = run_phasor([name, "--use-qk-l2norm", "--scale", "0.5", "--chunk-size", "4"], z)
        compare(f"{name} float32, strong and zero gates, fwd+bwd", out, expected, 1e-4)


# ---- Forgetting attention ------------------------------------------------------------------------------

def test_forgetting_attn():
    torch.manual_seed(3)
    B, T, HQ, H, K, V = 2, 12, 4, 2, 5, 3
    x = {"q": torch.randn(B, T, HQ, K, dtype=torch.float64),
         "k": torch.randn(B, T, H, K, dtype=torch.float64),
         "v": torch.randn(B, T, H, V, dtype=torch.float64),
         "g": log_gates((B, T, HQ), mean=1.0),
         "do": torch.randn(B, T, HQ, V, dtype=torch.float64)}
    names = ["q", "k", "v", "g"]
    for window in (None, 3):
        fwd = lambda a: [forgetting_attn_ref(a["q"], a["k"], a["v"], a["g"], None, window)]
        o = fwd(x)[0]
        grads = reference_grads(fwd, x, names, [0], [x["do"]])
        expected = {"o": o, **{"d" + n: grads[n] for n in names}}
        for impl in IMPLS:
            args = ["forgetting_attn", "--impl", impl, "--chunk-size", "4"]
            if window:
                args += ["--window-size", str(window)]
            _, _, out = run_phasor(args, x)
            compare(f"forgetting_attn {impl} float64 grouped, window {window}, fwd+bwd", out,
                    expected, 1e-9)

    lengths = [3, 0, 8, 1]
    T = sum(lengths)
    y = {"q": torch.randn(1, T, HQ, K, dtype=torch.float64),
         "k": torch.randn(1, T, H, K, dtype=torch.float64),
         "v": torch.randn(1, T, H, V, dtype=torch.float64),
         "g": log_gates((1, T, HQ)),
         "cu_seqlens": cu(lengths),
         "do": torch.randn(1, T, HQ, V, dtype=torch.float64)}
    fwd = lambda a: [forgetting_attn_ref(a["q"], a["k"], a["v"], a["g"], None, None,
                                         y["cu_seqlens"])]
    o = fwd(y)[0]
    grads = reference_grads(fwd, y, names, [0], [y["do"]])
    expected = {"o": o, **{"d" + n: grads[n] for n in names}}
    for impl in IMPLS:
        _, _, out = run_phasor(["forgetting_attn", "--impl", impl, "--chunk-size", "2"], y)
        compare(f"forgetting_attn {impl} varlen (empty sequence) fwd+bwd", out, expected, 1e-9)

    # float32 through the fla name with −20 and −inf gates, scale 0.7.
    z = {key: x[key].float() for key in ("q", "k", "v", "g", "do")}
    z["g"][0, 5, 1] = float("-inf")
    z["g"][1, 2:5] = -20.0
    fwd = lambda a: [forgetting_attn_ref(a["q"], a["k"], a["v"], a["g"], 0.7)]
    o = fwd(z)[0]
    grads = reference_grads(fwd, z, names, [0], [z["do"].double()])
    expected = {"o": o, **{"d" + n: grads[n] for n in names}}
    _, _, out = run_phasor(["parallel_forgetting_attn", "--scale", "0.7", "--chunk-size", "4"], z)
    compare("parallel_forgetting_attn float32, strong and zero gates, fwd+bwd", out, expected, 1e-4)


# ---- fused rotation (theta) ------------------------------------------------------------------------------

def rotate(x, theta, interleaved):
    """Pairs (i, i + K/2) (half-split) or (2i, 2i + 1) (interleaved) of x [B, T, H, K] rotated by
    theta [B, T, H, K/2]: y_a = x_a cos θ − x_b sin θ, y_b = x_a sin θ + x_b cos θ."""
    R = x.shape[-1] // 2
    c, s = torch.cos(theta), torch.sin(theta)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    a, b = x[..., :R], x[..., R:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def test_rotation():
    """Each op with theta in the input == the pure-PyTorch implementation on rotated q and k, for
    both layouts; dtheta is autograd's gradient through the explicit rotation."""
    torch.manual_seed(5)
    B, T, H, K, V = 2, 10, 2, 6, 3
    base = {"q": torch.randn(B, T, H, K, dtype=torch.float64),
            "k": torch.randn(B, T, H, K, dtype=torch.float64),
            "v": torch.randn(B, T, H, V, dtype=torch.float64),
            "theta": 3 * torch.randn(B, T, H, K // 2, dtype=torch.float64),
            "do": torch.randn(B, T, H, V, dtype=torch.float64)}
    for interleaved in (False, True):
        flag = ["--rotary-interleaved"] if interleaved else []
        layout = "interleaved" if interleaved else "half-split"
        rot = lambda a, key: rotate(a[key], a["theta"], interleaved)
        cases = [
            ("gla", dict(base, g=log_gates((B, T, H, K))),
             lambda a: [gla_ref(rot(a, "q"), rot(a, "k"), a["v"], a["g"])[0]],
             ["q", "k", "v", "g", "theta"]),
            ("gated_delta_rule",
             dict(base, g=log_gates((B, T, H), 3.0), beta=torch.rand(B, T, H, dtype=torch.float64)),
             lambda a: [gated_delta_rule_ref(rot(a, "q"), rot(a, "k"), a["v"], a["g"], a["beta"],
                                             None, None, None, True)[0]],
             ["q", "k", "v", "g", "beta", "theta"]),
            ("forgetting_attn", dict(base, g=log_gates((B, T, H), 1.0)),
             lambda a: [forgetting_attn_ref(rot(a, "q"), rot(a, "k"), a["v"], a["g"])],
             ["q", "k", "v", "g", "theta"]),
        ]
        for op, x, fwd, names in cases:
            o = fwd(x)[0]
            grads = reference_grads(fwd, x, names, [0], [x["do"]])
            expected = {"o": o, **{"d" + n: grads[n] for n in names}}
            extra = ["--use-qk-l2norm"] if op == "gated_delta_rule" else []
            for impl in IMPLS:
                _, err, out = run_phasor([op, "--impl", impl, "--chunk-size", "4", *flag, *extra], x)
                compare(f"{op} {impl} with theta ({layout}) fwd+bwd", out, expected, 1e-9)
                if out is None:
                    print(err)
    x = dict(base, g=log_gates((B, T, H, K)))
    expect_usage_error("error: theta of the wrong shape", ["gla"],
                       dict(x, theta=torch.zeros(B, T, H, K)), ["'theta'"])
    no_theta = {key: value for key, value in x.items() if key != "theta"}
    expect_usage_error("error: --rotary-interleaved without theta", ["gla", "--rotary-interleaved"],
                       no_theta, ["'--rotary-interleaved'"])


# ---- devices ---------------------------------------------------------------------------------------

def test_devices():
    """--device emulated runs the CUDA kernels' source on the CPU: outputs and gradients equal
    --device cpu (float64 inputs: to rounding; float32: within a different summation order);
    --device cuda equals cpu on a machine with a GPU and exits 2 naming the device without one;
    an implementation without CUDA kernels exits 2 naming it."""
    torch.manual_seed(6)
    T, H, K, V = 9, 2, 6, 5
    cu_seqlens = torch.tensor([0, 4, 4, 9], dtype=torch.int32)
    base = {"q": torch.randn(1, T, H, K), "k": torch.randn(1, T, H, K),
            "v": torch.randn(1, T, H, V), "theta": 3 * torch.randn(1, T, H, K // 2),
            "initial_state": torch.randn(3, H, K, V), "dht": torch.randn(3, H, K, V),
            "do": torch.randn(1, T, H, V), "cu_seqlens": cu_seqlens}
    cases = [
        ("fused_recurrent_gla", dict(base, g=log_gates((1, T, H, K)).float()), []),
        ("chunk_gla", dict(base, g=log_gates((1, T, H, K)).float()), []),
        ("fused_recurrent_gated_delta_rule",
         dict(base, g=log_gates((1, T, H), 3.0).float(), beta=2 * torch.rand(1, T, H)),
         ["--use-qk-l2norm"]),
        ("chunk_gated_delta_rule",
         dict(base, g=log_gates((1, T, H), 3.0).float(), beta=2 * torch.rand(1, T, H)),
         ["--use-qk-l2norm"]),
        ("parallel_forgetting_attn",
         {key: value for key, value in dict(base, g=log_gates((1, T, H), 3.0).float()).items()
          if key not in ("initial_state", "dht")}, []),
    ]
    for op, x, extra in cases:
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
            inputs = {key: (value.to(dtype) if value.is_floating_point() else value)
                      for key, value in x.items()}
            chunk = "4" if op.startswith("fused_recurrent") else "16"
            state = [] if op == "parallel_forgetting_attn" else ["--output-final-state"]
            args = [op, "--chunk-size", chunk, *state, *extra]
            _, err, cpu = run_phasor([*args, "--device", "cpu"], inputs)
            if cpu is None:
                report(f"{op} --device cpu ({dtype})", False, err.strip())
                continue
            _, err, emulated = run_phasor([*args, "--device", "emulated"], inputs)
            if emulated is None:
                report(f"{op} --device emulated ({dtype})", False, err.strip())
                continue
            compare(f"{op} --device emulated == cpu ({dtype})", emulated, cpu, tol)
            rc, err, gpu = run_phasor([*args, "--device", "cuda"], inputs)
            if rc == 0:
                compare(f"{op} --device cuda == cpu ({dtype})", gpu, cpu, tol)
            else:
                report(f"{op} --device cuda without a GPU: exit 2 naming the device",
                       rc == 2 and "device cuda" in err, f"exit status {rc}, stderr {err.strip()!r}")
    x = {key: value for key, value in cases[0][1].items() if key not in ("dht", "initial_state")}
    expect_usage_error("error: the float64 reference on the emulated GPU (cpu only)",
                       ["gla_reference", "--device", "emulated"], x, ["gla_reference", "'impl'"])
    expect_usage_error("error: chunk_gla on a GPU device with a chunk size of 8",
                       ["chunk_gla", "--chunk-size", "8", "--device", "emulated"], x,
                       ["chunk_gla", "'chunk_size'"])
    expect_usage_error("error: unknown device", ["gla", "--device", "tpu"], x,
                       ["'--device'", "tpu"])


# ---- bad input -----------------------------------------------------------------------------------------------

def expect_usage_error(name, args, inputs, fragments):
    rc, err, _ = run_phasor(args, inputs)
    missing = [f for f in fragments if f not in err]
    report(name, rc == 2 and not missing,
           f"exit status {rc} (expected 2), stderr {err.strip()!r} lacks {missing}")


def test_errors():
    torch.manual_seed(4)
    B, T, H, K, V = 2, 6, 2, 4, 4
    x = {"q": torch.randn(B, T, H, K), "k": torch.randn(B, T, H, K), "v": torch.randn(B, T, H, V),
         "g": log_gates((B, T, H, K)).float()}
    no_v = {key: value for key, value in x.items() if key != "v"}
    expect_usage_error("error: missing key 'v'", ["gla"], no_v, ["'v'"])
    bad_k = dict(x, k=torch.randn(B, T, H, K + 1))
    expect_usage_error("error: wrong shape of k", ["chunk_gla"], bad_k, ["chunk_gla", "'k'", "shape"])
    varlen_b2 = dict(x, cu_seqlens=torch.tensor([0, 2, 6], dtype=torch.int32))
    expect_usage_error("error: cu_seqlens with B = 2", ["gla", "--impl", "recurrent"], varlen_b2,
                       ["'cu_seqlens'", "B = 2"])
    expect_usage_error("error: positive log gate", ["gla"], dict(x, g=x["g"].abs() + 0.1), ["'g'"])
    expect_usage_error("error: unknown op", ["linear_attn"], x, ["'NAME'", "linear_attn"])
    expect_usage_error("error: unknown impl", ["gla", "--impl", "fast"], x, ["'--impl'", "fast"])
    expect_usage_error("error: impl contradicts fla name", ["chunk_gla", "--impl", "recurrent"], x,
                       ["'--impl'", "chunk"])
    expect_usage_error("error: unknown key", ["gla"], dict(x, intial_state=torch.zeros(B, H, K, V)),
                       ["'intial_state'"])
    expect_usage_error("error: do of the wrong shape", ["gla"], dict(x, do=torch.zeros(B, T, H, V + 1)),
                       ["'do'", "shape"])
    expect_usage_error("error: beta missing", ["gated_delta_rule"],
                       {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"][..., 0]}, ["'beta'"])
    expect_usage_error("error: window size with gla", ["gla", "--window-size", "4"], x,
                       ["'--window-size'"])
    expect_usage_error("error: window size 0", ["forgetting_attn", "--window-size", "0"],
                       {"q": x["q"], "k": x["k"], "v": x["v"], "g": x["g"][..., 0]},
                       ["window_size"])
    expect_usage_error("error: chunk size 0", ["gla", "--chunk-size", "0"], x, ["chunk_size"])
    expect_usage_error("error: integer q", ["gla"], dict(x, q=torch.ones(B, T, H, K, dtype=torch.int64)),
                       ["'q'", "dtype"])
    rc = subprocess.run([PHASOR, "op", "gla", "--in", os.path.join(WORK, "absent.pt"), "--out",
                         os.path.join(WORK, "o.pt")], capture_output=True, text=True)
    report("error: unreadable --in file", rc.returncode == 2 and "'--in'" in rc.stderr,
           f"exit status {rc.returncode}, stderr {rc.stderr.strip()!r}")
    rc = subprocess.run([PHASOR, "op", "gla", "--in", "x.pt"], capture_output=True, text=True)
    report("error: --out missing", rc.returncode == 2 and "--out" in rc.stderr,
           f"exit status {rc.returncode}, stderr {rc.stderr.strip()!r}")


def main():
    for test in (test_gla, test_gated_delta_rule, test_forgetting_attn, test_rotation,
                 test_devices, test_errors):
        try:
            test()
        except Exception as e:  # a crash in one group must not hide the others' results
            report(test.__name__, False, f"raised {type(e).__name__}: {e}")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
