# SPDX-License-Identifier: Apache-2.0
"""A user variant against the built-in it reproduces (issue 17: within 3% of its time): ALiBi
written as a kiln.Variant (examples/variants.hpp's `alibi`, its slope the row's state) next to
the built-in alibi_slopes and to plain attention, through kiln's Python package, in prefill
(flash_attn_func) and decode (flash_attn_with_kvcache), bf16, in one process on one GPU.

    KILN_LIB=build KILN_CACHE_DIR=$(mktemp -d) python3 bench/variants.py [--reps N]

Each row times its three calls taking turns, sample by sample (bench_common.time_interleaved:
CUDA events around --per-sample back-to-back calls, median of --reps samples), and checks the
variant's output against the built-in's (max abs diff < 0.02; a mismatch makes the exit status
1). With $OUT set, the results go to $OUT/variants.json.
"""
import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (ROOT, device_line, library_line, save_results, start,  # noqa: E402
                          time_interleaved, warm_up)

PREFILL = [  # head dim, seqlen, batch, heads, causal
    (128, 4096, 4, 16, False), (128, 4096, 4, 16, True), (64, 4096, 4, 32, True),
    (256, 2048, 4, 8, True), (256, 4096, 2, 16, True)]
DECODE = [(32, 4096, 32, 8), (8, 16384, 32, 8), (128, 2048, 32, 4)]  # batch, length, heads, kv


def alibi_variant(kiln):
    """examples/variants.hpp's ALiBi, as the C++ tests compile it."""
    with open(os.path.join(ROOT, "examples", "variants.hpp")) as f:
        text = f.read()
    code = re.search(r'\.name = "alibi", \.code = R"\((.*?)\)"', text, re.S).group(1)
    return kiln.Variant("alibi", code)


def measure(name, calls, args):
    """Times plain, built-in and variant; returns the row, or None when one failed."""
    errors = {}
    warm_up(calls, errors)
    ms = time_interleaved(calls, args.reps, errors, per_sample=args.per_sample)
    if errors:
        print(f"{name}: failed: {errors}")
        return None
    ratio = ms["variant"] / ms["built-in"]
    print(f"{name:36s} | {ms['plain']:8.4f} {ms['built-in']:8.4f} {ms['variant']:8.4f} | "
          f"{ratio:6.3f}", flush=True)
    return {"row": name, **ms, "variant/built-in": ratio}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=40, help="timed samples per call and row")
    p.add_argument("--per-sample", type=int, default=5, help="back-to-back calls per sample")
    p.add_argument("--lib", default=None, help="libkiln.so or its build dir (default $KILN_LIB)")
    args = p.parse_args()
    kiln, header = start(args, lambda kiln, args: [device_line(), library_line(kiln)])
    variant = alibi_variant(kiln)
    print(f"ms per call (median of {args.reps} samples of {args.per_sample} calls, the three "
          f"calls taking turns)")
    print(f"{'row':36s} | {'plain':>8s} {'built-in':>8s} {'variant':>8s} | var/bi")
    rows, ok = [], True
    for d, s, b, h, causal in PREFILL:
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        slopes = torch.rand(h, device="cuda") * 0.5 + 0.05
        calls = {
            "plain": lambda: kiln.flash_attn_func(q, k, v, causal=causal),
            "built-in": lambda: kiln.flash_attn_func(q, k, v, causal=causal,
                                                     alibi_slopes=slopes),
            "variant": lambda: kiln.flash_attn_func(q, k, v, causal=causal, variant=variant,
                                                    variant_tensors=[slopes]),
        }
        diff = (calls["built-in"]().float() - calls["variant"]().float()).abs().max().item()
        ok = ok and diff < 0.02
        row = measure(f"prefill d{d} s{s} b{b} h{h} {'causal' if causal else 'full'}", calls,
                      args)
        ok = ok and row is not None
        rows.append(dict(row or {}, max_abs_diff=diff))
    for batch, length, h, hk in DECODE:
        q = torch.randn(batch, 1, h, 128, device="cuda", dtype=torch.bfloat16)
        kc, vc = (torch.randn(batch, length, hk, 128, device="cuda", dtype=torch.bfloat16)
                  for _ in range(2))
        lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
        slopes = torch.rand(h, device="cuda") * 0.5 + 0.05
        calls = {
            "plain": lambda: kiln.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens),
            "built-in": lambda: kiln.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                             alibi_slopes=slopes),
            "variant": lambda: kiln.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                            variant=variant,
                                                            variant_tensors=[slopes]),
        }
        diff = (calls["built-in"]().float() - calls["variant"]().float()).abs().max().item()
        ok = ok and diff < 0.02
        row = measure(f"decode b{batch} length {length} h{h}/{hk}", calls, args)
        ok = ok and row is not None
        rows.append(dict(row or {}, max_abs_diff=diff))
    ratios = [r["variant/built-in"] for r in rows if "variant/built-in" in r]
    if ratios:
        print(f"variant/built-in: {min(ratios):.3f} to {max(ratios):.3f}")
    print("check: every variant output matched the built-in's" if ok else
          "check: FAILED (a mismatch or a failed call above)")
    save_results("variants.json", {"header": header, "args": vars(args), "rows": rows})
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
