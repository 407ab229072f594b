#!/usr/bin/env python3
"""Roofline estimates of phasor's GPU chunk kernels on an H100 (SXM) — an ESTIMATE, not a
measurement: no GPU has run these kernels yet.

chunk_gla and chunk_gated_delta_rule: for each kernel the model counts, per chunk of C tokens and
per head, the floating-point operations (a multiply-add is 2) and the bytes the kernel as written
moves through global memory (every tile it loads, including the repeated loads of the tiling: the
output kernels reload q and the gates for every value tile, the state kernels k, g and v for every
key × value tile), at K = V = 128, C = 64, 32-wide key tiles, value tiles of 32 (64 for GLA's
states, output, dstates and dv kernels and Gated DeltaNet's output kernel), bfloat16 inputs and outputs (2 bytes) and float32
workspaces (4 bytes). The time bound of a kernel is max(FLOPs / peak, bytes / bandwidth) —
tensor-core products at the dense bfloat16 peak, the elementwise and diagonal-block work on the
FMA units — summed over the kernels of a call (they run one after another), at fla's benchmark
shape B = 2, T = 16384, H = 16.

parallel_forgetting_attn (causal, no window) is compute-bound: its products grow as T² while its
unique bytes grow as T. The model counts per visible tile pair the tensor-core FLOPs of the
products and, per logit, the scalar instructions of the kernel as written (float32 softmax
arithmetic, float64 gate-bias sums, one exp on the special-function units), each at its own
H100 issue rate, summed (no overlap between the pipes: a bound the kernel can approach only if it
keeps every pipe busy, which its one-thread-per-row softmax does not). Its bytes are the unique
DRAM traffic (each input and output once); the repeated key/value tile loads (listed) are served
by the 50 MB L2, which holds one (sequence, head)'s keys and values at this shape.

    python3 scripts/roofline.py
"""

K = V = 128
C = 64
BK = BV = 32
WIDE = 64  # the value tile of GLA's states, output, dstates and dv kernels and of GDN's output
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
    # The output kernel's value tile is 64 wide; the scans (states, dstates) keep 32 at this shape
    # (64-wide tiles would leave 64 blocks for 132 SMs: chunk.cu's kScanBlocks rule).
    wide, WT = WIDE, V // WIDE
    states = ("states", mm(C, V, K) + mm(K, V, C), 0,
              VT * (K * BV * WS + C * BV * WS + C * K * WS + C * K * IN + C * BV * WS))
    output = ("output", mm(C, V, K) + mm(C, V, C), 0,
              WT * (C * K * IN + K * wide * WS + C * C * WS + C * wide * WS + C * wide * IN))
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


# H100 SXM issue rates of scalar instructions, per second: 132 SMs × lanes per clock × 1.98 GHz.
SCALAR = {"fp32": 132 * 128 * 1.98e9, "fp64": 132 * 64 * 1.98e9, "sfu": 132 * 16 * 1.98e9}
FOX_TILE = {"forward": 64, "backward": 32}  # the kernels' Bt at K = V = 128 (160 KiB rule)


def fox():
    """(name, tensor FLOPs, scalar instructions {pipe: count}, unique bytes, L2 tile bytes) per
    (sequence, head) for B = 1 at SHAPE's T, forward and backward kernels."""
    T = SHAPE["T"]
    out = {}
    for direction, bt in FOX_TILE.items():
        blocks = T // bt
        pairs = blocks * (blocks + 1) // 2          # visible (query tile, key tile) pairs
        logits = pairs * bt * bt
        tile_bytes = pairs * bt * (K + V) * IN      # a key and a value tile per pair
        if direction == "forward":
            # S = q kᵀ, A += P v; per logit: scale + bias add, max, subtract, exp, row sum, rescale
            # (float32), the bias's two float64 adds and its rounding, one exp.
            out["forward"] = ("forward", pairs * 2 * bt * bt * (K + V),
                              {"fp32": 6 * logits, "fp64": 3 * logits, "sfu": logits},
                              T * ((2 * K + V) * IN + 4 + V * IN + 4), tile_bytes)  # q k v g | o lse
        else:
            # dq: S, dP = do vᵀ, dq = dℓ k; dkv: S, dP, dv = Pᵀ do, dk = dℓᵀ q. Per logit in each:
            # the logit again (float32 2, float64 3), P (one exp), dℓ = P(dP − D) (2), float64
            # row / column sums for dg (2).
            per = {"fp32": 4 * logits, "fp64": 5 * logits, "sfu": logits}
            # q k v do o lse g | dq dk dv dg, half of it to each kernel
            unique = T * ((2 * K + 3 * V) * IN + 8 + (2 * K + V) * IN + 4)
            out["dq"] = ("dq", pairs * 2 * bt * bt * (2 * K + V), per, unique / 2,
                         pairs * bt * (K + V) * IN)
            out["dkv"] = ("dkv", pairs * 2 * bt * bt * (2 * K + 2 * V), per, unique / 2,
                          pairs * bt * (K + V + K) * IN)
    return [out["forward"]], [out["dq"], out["dkv"]]


def fox_seconds(kernel, sequences):
    _, tensor, scalar, unique, _ = kernel
    compute = tensor / H100["tensor"] + sum(n / SCALAR[pipe] for pipe, n in scalar.items())
    return sequences * max(compute, unique / H100["bandwidth"])


def main():
    tokens = SHAPE["B"] * SHAPE["T"]
    chunks = tokens * SHAPE["H"] // C
    print(f"Per kernel, per token and head (B = {SHAPE['B']}, T = {SHAPE['T']}, H = {SHAPE['H']}, "
          f"K = V = {K}, C = {C}, bfloat16):\n")
    print("| op | kernel | tensor FLOPs | FMA FLOPs | bytes | H100 bound (ms) | bound by |")
    print("|---|---|---|---|---|---|---|")
    for op, (fwd, both) in {"chunk_gla": gla(), "chunk_gated_delta_rule": gdn()}.items():
        seen = []
        for kernel in fwd + both:
            if kernel[0] in seen:
                continue
            seen.append(kernel[0])
            name, tensor, fma, nbytes = kernel
            t = seconds([kernel], chunks) * 1e3
            compute = chunks * (tensor / H100["tensor"] + fma / H100["fma"]) * 1e3
            print(f"| {op} | {name} | {tensor / C / 1e3:.1f} k | {fma / C / 1e3:.1f} k | "
                  f"{nbytes / C:.0f} | {t:.3f} | {'memory' if t > compute * 1.01 else 'compute'} |")
    print("\nPer call (the kernels of a call run one after another; the backward re-runs the "
          "forward's state kernels):\n")
    print("| op | pass | FLOPs/token/head | bytes/token/head | H100 bound (ms) | tokens/s | "
          "bound by | fla on GB200 (ms) |")
    print("|---|---|---|---|---|---|---|---|")
    for op, (fwd, both) in {"chunk_gla": gla(), "chunk_gated_delta_rule": gdn()}.items():
        for label, kernels, fla in (("forward", fwd, FLA[op][0]),
                                    ("forward + backward", fwd + both, FLA[op][1])):
            flops = sum(t + f for _, t, f, _ in kernels) / C
            nbytes = sum(b for *_, b in kernels) / C
            t = seconds(kernels, chunks) * 1e3
            compute = sum(chunks * (k[1] / H100["tensor"] + k[2] / H100["fma"]) for k in kernels)
            bound = "memory" if t / 1e3 > compute * 1.01 else "compute"
            print(f"| {op} | {label} | {flops / 1e3:.0f} k | {nbytes / 1e3:.1f} kB | {t:.2f} | "
                  f"{tokens / (t / 1e3) / 1e6:.0f} M | {bound} | {fla:.3f} |")
    sequences = SHAPE["B"] * SHAPE["H"]
    T = SHAPE["T"]
    print(f"\nparallel_forgetting_attn, causal, HQ = H = {SHAPE['H']}, tiles of "
          f"{FOX_TILE['forward']} (forward) and {FOX_TILE['backward']} (backward):\n")
    print("| kernel or pass | tensor FLOPs/token/head | scalar instr./token/head (fp32, fp64, exp) | "
          "unique bytes/token/head | L2 tile loads/token/head | H100 bound (ms) | tokens/s |")
    print("|---|---|---|---|---|---|---|")
    fwd, bwd = fox()
    rows = [(f"{k[0]} kernel", [k]) for k in bwd] + [("forward", fwd),
                                                       ("forward + backward", fwd + bwd)]
    for label, kernels in rows:
        tensor = sum(k[1] for k in kernels) / T
        scalar = [sum(k[2][pipe] for k in kernels) / T for pipe in ("fp32", "fp64", "sfu")]
        unique = sum(k[3] for k in kernels) / T
        l2 = sum(k[4] for k in kernels) / T
        t = sum(fox_seconds(k, sequences) for k in kernels) * 1e3
        print(f"| {label} | {tensor / 1e6:.2f} M | {', '.join(f'{x / 1e3:.0f} k' for x in scalar)} | "
              f"{unique:.0f} | {l2 / 1e3:.0f} k | {t:.2f} | {tokens / (t / 1e3) / 1e6:.1f} M |")


if __name__ == "__main__":
    main()
