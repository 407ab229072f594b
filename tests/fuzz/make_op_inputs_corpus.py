#!/usr/bin/env python3
"""Writes the seed corpus of op_inputs_fuzz: files written by torch.save, as `phasor op --in`
reads them, each behind the two bytes the target decodes first (op and implementation, flags;
see op_inputs_fuzz.cpp).

    /usr/bin/python3 tests/fuzz/make_op_inputs_corpus.py tests/fuzz/corpus/op_inputs_fuzz

Valid inputs of every op (forward, backward with do / dht, initial_state, cu_seqlens, theta,
bfloat16 and float64 tensors, a non-contiguous tensor) and a few wrong ones (an unknown key, a
value that is not a tensor, a list instead of a dict, integer keys). Deterministic: the tensors
come from a seeded generator and torch.save writes the same bytes each time.
"""
import io
import os
import sys

import torch

OPS = {"gla": 0, "gated_delta_rule": 1, "forgetting_attn": 2}
IMPLS = {"reference": 0, "recurrent": 1, "chunk": 2}


def prefix(op, impl, output_final_state=False, l2norm=False, interleaved=False, chunk2=False):
    flags = (1 if output_final_state else 0) | (2 if l2norm else 0) | (4 if interleaved else 0)
    flags |= (32 if chunk2 else 0) | 128  # 128: the target forges CRCs of mutated entries
    return bytes([OPS[op] + 3 * IMPLS[impl], flags])


def saved(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def inputs(op, B=1, T=3, H=2, K=4, V=4, dtype=torch.float32, **extra):
    g = torch.Generator().manual_seed(len(op) * 1000 + T * 10 + K)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)
    d = {"q": r(B, T, H, K), "k": r(B, T, H, K), "v": r(B, T, H, V)}
    if op == "gla":
        d["g"] = -torch.rand(B, T, H, K, generator=g, dtype=torch.float64).to(dtype)
    else:
        d["g"] = -torch.rand(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    if op == "gated_delta_rule":
        d["beta"] = torch.rand(B, T, H, generator=g, dtype=torch.float64).to(dtype)
    for key, value in extra.items():
        d[key] = value(r) if callable(value) else value
    return d


def main(out):
    os.makedirs(out, exist_ok=True)
    files = {}
    for op in OPS:
        for impl in IMPLS:
            files[f"{op}_{impl}"] = prefix(op, impl) + saved(inputs(op))
        files[f"{op}_backward"] = prefix(op, "chunk") + saved(
            inputs(op, do=lambda r: r(1, 3, 2, 4)))
        files[f"{op}_cu_seqlens"] = prefix(op, "chunk", chunk2=True) + saved(
            inputs(op, T=5, cu_seqlens=torch.tensor([0, 2, 5], dtype=torch.int32)))
        files[f"{op}_theta"] = prefix(op, "recurrent", interleaved=True) + saved(
            inputs(op, theta=lambda r: r(1, 3, 2, 2)))
        files[f"{op}_bfloat16"] = prefix(op, "chunk") + saved(inputs(op, dtype=torch.bfloat16))
    for op in ("gla", "gated_delta_rule"):
        files[f"{op}_state"] = prefix(op, "chunk", output_final_state=True) + saved(
            inputs(op, initial_state=lambda r: r(1, 2, 4, 4), do=lambda r: r(1, 3, 2, 4),
                   dht=lambda r: r(1, 2, 4, 4)))
        files[f"{op}_float64"] = prefix(op, "recurrent", l2norm=True) + saved(
            inputs(op, dtype=torch.float64))
    files["gla_noncontiguous"] = prefix("gla", "chunk") + saved(
        inputs("gla", v=lambda r: r(1, 2, 3, 4).transpose(1, 2)))
    files["bad_unknown_key"] = prefix("gla", "chunk") + saved(inputs("gla", beta=torch.ones(1)))
    files["bad_not_a_tensor"] = prefix("gla", "chunk") + saved({"q": torch.ones(1), "k": [1, 2]})
    files["bad_list"] = prefix("gla", "chunk") + saved([torch.ones(2), torch.ones(3)])
    files["bad_int_keys"] = prefix("gla", "chunk") + saved({1: torch.ones(1), 2: torch.ones(1)})
    files["bad_not_zip"] = prefix("gla", "chunk") + b"PK\x03\x04 not really a zip archive"
    for name, data in sorted(files.items()):
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(files)} files in {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fuzz/corpus/op_inputs_fuzz")
