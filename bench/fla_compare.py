#!/usr/bin/env python3
"""fla's Triton kernels timed on this GPU at the shapes of phasor's device benchmarks.

The GPU counterpart of bench/ggml-compare.sh: run it in the same session as phasor's
`--benchmark_filter='Device/device:1/'` rows (scripts/gpu-check.sh does both) and divide. It needs
PyTorch with CUDA, Triton, einops and transformers, and an fla checkout the user points to (any
clone of github.com/fla-org/flash-linear-attention; never vendored):

    python3 bench/fla_compare.py /path/to/flash-linear-attention [--out fla.jsonl]

Shapes and inputs follow phasor's benchmarks (bench/*_bench.cpp):
  - chunk_gla, chunk_gated_delta_rule: K = V = 128, bfloat16, fla's shapes (B, T, H) = (2, 16384, 16)
    and (1, 8192, 96); GLA gates log σ(3 + N(0, 1)) per key channel, Gated DeltaNet gates the
    same per head with β = σ(N(0, 1)) and the ℓ2 norm of q and k in the kernel.
  - parallel_forgetting_attn: B = 1, H = 8, K = V = 128, float32, T = 1024, 4096, 16384, gates
    log σ(5 + N(0, 1)) (BM_FoxChunkDevice).
Times are medians of triton.testing.do_bench (CUDA events), forward alone and forward + backward.
"""
import argparse
import json
import sys
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("fla", help="path of an fla checkout (the folder holding fla/)")
    parser.add_argument("--out", help="also write one JSON line per measurement here")
    parser.add_argument("--ops", default="gla,gdn,fox", help="comma-separated: gla, gdn, fox")
    args = parser.parse_args()
    sys.path.insert(0, args.fla)

    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    dev = "cuda"
    torch.manual_seed(0)
    rows = []
    # Each row is written as it is measured: a run stopped at a time cap (Triton's autotuning
    # can take minutes per kernel) keeps what it measured.
    out_file = open(args.out, "w") if args.out else None

    def measure(op, shape, dtype, make, call):
        for backward in (False, True):
            inputs = make()
            d_o = torch.randn_like(inputs[2])

            def run():
                out = call(*inputs)
                if backward:  # gradients returned, not accumulated into .grad (no extra adds)
                    torch.autograd.grad(out, inputs, d_o)

            t0 = time.time()
            run()  # compiles and autotunes
            torch.cuda.synchronize()
            first = time.time() - t0
            ms = do_bench(run, warmup=25, rep=200, return_mode="median")
            B, T, H = shape
            row = {"library": "fla", "op": op, "B": B, "T": T, "H": H, "dtype": dtype,
                   "pass": "fwd+bwd" if backward else "fwd", "ms": ms,
                   "tokens_per_s": B * T / (ms / 1e3), "first_call_s": first}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if out_file:
                out_file.write(json.dumps(row) + "\n")
                out_file.flush()
            del inputs
            torch.cuda.empty_cache()

    ops = set(args.ops.split(","))
    bf16 = torch.bfloat16

    def qkv(B, T, H, dtype):
        """q, k, v of shape [B, T, H, 128], standard normal, on the GPU."""
        return tuple(torch.randn(B, T, H, 128, device=dev, dtype=dtype) for _ in range(3))

    if "gla" in ops:
        from fla.ops.gla import chunk_gla
        for B, T, H in [(2, 16384, 16), (1, 8192, 96)]:
            def make(B=B, T=T, H=H):
                q, k, v = qkv(B, T, H, bf16)
                g = F.logsigmoid(3 + torch.randn(B, T, H, 128, device=dev)).to(bf16)
                return [x.requires_grad_() for x in (q, k, v, g)]
            measure("chunk_gla", (B, T, H), "bfloat16", make,
                    lambda q, k, v, g: chunk_gla(q, k, v, g)[0])
    if "gdn" in ops:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        for B, T, H in [(2, 16384, 16), (1, 8192, 96)]:
            def make(B=B, T=T, H=H):
                q, k, v = qkv(B, T, H, bf16)
                g = F.logsigmoid(3 + torch.randn(B, T, H, device=dev)).to(bf16)
                beta = torch.sigmoid(torch.randn(B, T, H, device=dev)).to(bf16)
                return [x.requires_grad_() for x in (q, k, v, g, beta)]
            measure("chunk_gated_delta_rule", (B, T, H), "bfloat16", make,
                    lambda q, k, v, g, beta: chunk_gated_delta_rule(
                        q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0])
    if "fox" in ops:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
        for T in (1024, 4096, 16384):
            def make(T=T):
                q, k, v = qkv(1, T, 8, torch.float32)
                g = F.logsigmoid(5 + torch.randn(1, T, 8, device=dev))
                return [x.requires_grad_() for x in (q, k, v, g)]
            measure("parallel_forgetting_attn", (1, T, 8), "float32", make,
                    lambda q, k, v, g: parallel_forgetting_attn(q, k, v, g))

    if out_file:
        out_file.close()
    print(f"{'op':<26}{'B':>3}{'T':>7}{'H':>4} {'dtype':<9}{'pass':<9}{'ms':>9}")
    for r in rows:
        print(f"{r['op']:<26}{r['B']:>3}{r['T']:>7}{r['H']:>4} {r['dtype']:<9}{r['pass']:<9}"
              f"{r['ms']:>9.3f}")


if __name__ == "__main__":
    main()
