#!/usr/bin/env python3
"""Roofline estimates of phasor's GPU chunk kernels on an H100 (SXM) — an ESTIMATE, not a
measurement: no GPU has run these kernels yet.

For each kernel the model counts, per chunk of C tokens and per head, the floating-point
operations (a multiply-add is 2) and the bytes the kernel as written moves through global memory
(every tile it loads, including the repeated loads of the tiling: the output kernels reload q
and the gates for every value tile, the state kernels k, g and v for every key × value tile),
at K = V = 128, C = 64, 32-wide key tiles, value tiles of 32 (128 for GLA's states, output,
dstates and dv kernels, which take value tiles as wide as V), bfloat16 inputs and outputs (2 bytes) and
float32 workspaces (4 bytes). The time bound of a kernel is max(FLOPs / peak, bytes / bandwidth)
— tensor-core products at the dense bfloat16 peak, the elementwise and diagonal-block work on
the FMA units — summed over the kernels of a call (they run one after another), at fla's
benchmark shape B = 2, T = 16384, H = 16.

    python3 scripts/roofline.py
"""

K = V = 128
C = 64
BK = BV = 32
WIDE = 64  # GLA's value tile of the states, output, dstates and dv kernels
IN = 2   # bytes of a bfloat16 input / output element
WS = 4   # bytes of a float32 workspace element
KT, VT = K // BK, V // BV

H100 = {"bandwidth": 3.35e12, "tensor": 989e12, "fma": 67e12}  # B/s, FLOP/s (dense bf16, fp32)
SHAPE = {"B": 2, "T": 16384, "H": 16}
FLA = {"chunk_gla": (1.445, 5.984), "chunk_gated_delta_rule": (1.029, 3.616)}  # GB200, ms


def gla():
    """(name, tensor FLOPs, FMA FLOPs, bytes) per chunk and head, forward and backward kernels."""
    strips = sum(2 * 16 * r * K for r in range(16, C, 16))          # (q⊙f_q)(k⊙f_k)ᵀ
    diag = (C // 16) * sum((i - j + 1) * K for i in range(16) for j in range(i + 1))
    wide_tiles = V // WIDE
    states = ("states", 2 * K * V * C, 0,
              KT * wide_tiles * (2 * C * BK * IN + C * WIDE * IN) + K * V * WS)  # k, g, v; S
    intra = ("intra", strips, diag, 3 * C * K * IN + C * C * WS)
    output = ("output", 2 * C * K * V + 2 * C * C * V, 0,
              wide_tiles * (2 * C * K * IN + K * WIDE * WS + C * C * WS + 2 * C * WIDE * IN))
    dstates = ("dstates", 2 * K * V * C, 0,
               KT * wide_tiles * (2 * C * BK * IN + C * WIDE * IN) + K * V * WS)
    dattn = ("dattn", 2 * C * C * V, 0, VT * 2 * C * BV * IN + C * C * WS)
    dv = ("dv", 2 * C * K * V + 2 * C * C * V, 0,
          wide_tiles * (2 * C * K * IN + K * WIDE * WS + C * C * WS + 2 * C * WIDE * IN))
    dqk = ("dqk", 2 * 2 * C * V * K + 2 * 2 * C * C * K, 2 * diag,
           KT * (3 * C * BK * IN + C * C * WS + VT * (2 * C * BV * IN + 2 * BK * BV * WS)
                 + 3 * C * BK * IN))
    return [states, intra, output], [states, dstates, intra, dattn, dv, dqk]


def gdn():
    mm = lambda m, n, k: 2 * m * n * k  # noqa: E731
    norms = ("norms", 0, 2 * C * K, 2 * C * K * IN)
    wy = ("wy", mm(C, C, K) * 2 + mm(C, V, C) + mm(C, K, C), C * C * C // 2,
          2 * C * K * IN + C * V * IN + C * K * IN + 3 * C * C * WS + C * V * WS + C * K * WS)
    states = ("states", mm(C, V, K) + mm(K, V, C), 0,
              VT * (K * BV * WS + C * BV * WS + C * K * WS + C * K * IN + C * BV * WS))
    output = ("output", mm(C, V, K) + mm(C, V, C), 0,
              VT * (C * K * IN + K * BV * WS + C * C * WS + C * BV * WS + C * BV * IN))
    dstates = ("dstates", mm(C, V, K) + 2 * mm(C, V, C) + 2 * mm(K, V, C), 0,
               VT * (K * BV * WS + 2 * C * K * IN + 2 * C * C * WS + C * BV * IN + C * BV * WS))
    dvalue = ("dvalue", 3 * mm(C, V, K) + 2 * mm(C, C, V), C * C * 8,
              VT * (2 * C * BV * WS + 2 * C * BV * IN + KT * (2 * C * BK * IN + 2 * BK * BV * WS))
              + 4 * C * C * WS + C * V * IN)
    dqk = ("dqk", 3 * mm(C, K, V) + 4 * mm(C, K, C), 0,
           KT * (2 * C * BK * IN + 2 * C * C * WS
                 + VT * (2 * C * BV * WS + C * BV * IN + 2 * BK * BV * WS)) + 2 * C * K * WS)
    finish = ("finish", 0, 12 * C * K, 2 * C * K * WS + 4 * C * K * IN)
    forward = [norms, wy, states, output]
    return forward, forward + [dstates, dvalue, dqk, finish]


def seconds(kernels, chunks):
    total = 0.0
    for _, tensor, fma, nbytes in kernels:
        total += chunks * max(tensor / H100["tensor"] + fma / H100["fma"],
                              nbytes / H100["bandwidth"])
    return total


def main():
    tokens = SHAPE["B"] * SHAPE["T"] * SHAPE["H"]
    chunks = tokens // C
    print("| op | pass | FLOPs/token | bytes/token | H100 bound (ms) | bound by | fla on GB200 (ms) |")
    print("|---|---|---|---|---|---|---|")
    for op, (fwd, both) in {"chunk_gla": gla(), "chunk_gated_delta_rule": gdn()}.items():
        for label, kernels, fla in (("forward", fwd, FLA[op][0]),
                                    ("forward + backward", fwd + both, FLA[op][1])):
            flops = sum(t + f for _, t, f, _ in kernels) / C
            nbytes = sum(b for *_, b in kernels) / C
            t = seconds(kernels, chunks) * 1e3
            compute = sum(chunks * (k[1] / H100["tensor"] + k[2] / H100["fma"]) for k in kernels)
            bound = "memory" if t / 1e3 > compute * 1.01 else "compute"
            print(f"| {op} | {label} | {flops / 1e3:.0f} k | {nbytes / 1e3:.1f} kB | {t:.2f} | "
                  f"{bound} | {fla:.3f} |")


if __name__ == "__main__":
    main()
