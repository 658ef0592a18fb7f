# SPDX-License-Identifier: Apache-2.0
"""Forward attention benchmark: kiln (its Python package, kiln.flash_attn_func) next to PyTorch
SDPA's flash, cuDNN and mem-efficient backends, in one process on one GPU (issue 3,
"Performance"; issue 16: the package reaches the C API's TFLOP/s).

    KILN_LIB=build KILN_CACHE_DIR=$(mktemp -d) python3 bench/attention.py [--quick] [--warm]

Rows: bf16 and fp16, head dims 64/128/256, seqlen 1k/4k/16k at 16k tokens (batch 16384 // seqlen)
and model dim 2048 (heads 2048 // d), causal or not: the rows of shared/peers/peers.py; then real
models' prefill shapes (MODEL_ROWS: GQA 4:1 and 8:1, head dims 80 and 96, batches of short
sequences), causal; then a varlen batch of mixed lengths (VARLEN_LENGTHS: kiln's
flash_attn_varlen_func on the packed tokens, SDPA on the same tokens as a jagged nested tensor, the
layout PyTorch offers for it). Each grid and model row also times kiln over e4m3 k and v (column
e4m3: the same k and v cast to e4m3 once, q and out in the row's dtype; issue 32) and, on sm_90a,
the all-fp8 forward (column fp8: q cast to e4m3 too, out in the row's
dtype; PyTorch's SDPA has no fp8 peer, FlashAttention-3's published fp8 figures are the one), and
checks each output against SDPA's over the dequantized inputs; fp8's within --tol plus 2^-4 of
v's largest magnitude, the most e4m3's rounding of the probabilities (2^-4 of each, relative, in
its normal range) can move an output that sums them times v. SDPA's fused kernels take no GQA, so on those
rows they get K and V repeated to every query head (the same FLOPs; kiln reads the kv heads once).
TFLOP/s count 4 * batch * heads * seqlen^2 * d FLOPs, half of that when causal (FlashAttention's
convention). Each row also checks kiln's output against SDPA's; a mismatch, or a row kiln could not
run, makes the exit status 1. With $OUT set, the results go to $OUT/attention.json.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (cell, describe, device_line, library_line, ratio,  # noqa: E402
                          save_results, start, time_interleaved, wall_ms, warm_up)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SDPA_BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}
BACKENDS = ["kiln", "kiln_e4m3", "kiln_fp8"] + list(SDPA_BACKENDS)
# Where the correctness check takes its expected output from, best first.
REFERENCE_ORDER = ["flash", "cudnn", "efficient"]
TOKENS, MODEL_DIM = 16384, 2048
# A first call slower than this after --warm means the warm-up did not cover the row's kernel.
COMPILED_MS = 250.0


def all_rows():
    return [(dt, d, s, c) for dt in DTYPES for d in (64, 128, 256) for s in (1024, 4096, 16384)
            for c in (False, True)]


# Prefill shapes of real models, causal, bf16: (name, batch, seqlen, heads, heads_kv, head dim).
MODEL_ROWS = [
    ("llama3-8b", 1, 8192, 32, 8, 128),      # GQA 4:1
    ("llama3-70b", 1, 8192, 64, 8, 128),     # GQA 8:1
    ("llama3-8b-short", 32, 512, 32, 8, 128),  # a batch of short prompts
    ("phi2", 4, 2048, 32, 32, 80),
    ("phi3-mini", 2, 4096, 32, 32, 96),
]

# One varlen batch (bf16, d 128, 16 heads, causal): sequence lengths of a mixed prefill batch.
VARLEN_LENGTHS = [4096, 3000, 2048, 1000, 512, 256, 129, 64]

# --quick: a smoke test that still touches both dtypes, three head dims and both masks.
QUICK_ROWS = [("bf16", 64, 1024, False), ("bf16", 128, 4096, True),
              ("fp16", 128, 1024, False), ("fp16", 256, 4096, True)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 rows only, for smoke tests")
    p.add_argument("--reps", type=int, default=30, help="timed calls per backend and row")
    p.add_argument("--rows", choices=["all", "grid", "models"], default="all",
                   help="the head-dim x seqlen grid, the model shapes (with the varlen "
                   "batch), or both (default)")
    p.add_argument("--lib", default=None, help="libkiln.so or its build dir (default $KILN_LIB; "
                   "neither: the installed package's, else ./build's)")
    p.add_argument("--layout", choices=["bshd", "bhsd"], default="bshd",
                   help="memory layout of the inputs that kiln and SDPA share (default bshd)")
    p.add_argument("--tol", type=float, default=2e-2, help="max abs diff kiln vs SDPA")
    p.add_argument("--warm", action="store_true",
                   help="run kiln.warmup() after the cold measurement and flag rows "
                        "whose kernel it did not cover")
    return p.parse_args()


# ------------------------------------------------------------------------------------- inputs
def make_inputs(dtype, d, seqlen, layout, batch=None, heads=None, heads_kv=None):
    """q, k, v and kiln's out as (batch, seqlen, heads, d) views of `layout` memory (k and v
    with heads_kv heads; by default the grid rows' batch and heads, and heads_kv = heads).

    kiln takes these views; SDPA takes .transpose(1, 2) views of the same storage, so both
    read identical bytes in an identical layout and no one pays for a copy.
    """
    batch = batch or TOKENS // seqlen
    heads = heads or MODEL_DIM // d
    heads_kv = heads_kv or heads

    def make(h):
        shape = (batch, seqlen, h, d) if layout == "bshd" else (batch, h, seqlen, d)
        t = torch.randn(shape, device="cuda", dtype=dtype)
        return t if layout == "bshd" else t.transpose(1, 2)
    # Fresh random inputs: zeros would make every backend agree whatever it computed.
    q, k, v = make(heads), make(heads_kv), make(heads_kv)
    out = torch.empty_like(q)
    return q, k, v, out


def row_flops(batch, heads, seqlen, d, causal):
    return 4 * batch * heads * seqlen * seqlen * d / (2 if causal else 1)


def sdpa_call(backend, q, k, v, causal):
    """SDPA restricted to one backend, on (batch, heads, seqlen, d) views; returns its output."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def call():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    return call


# ---------------------------------------------------------------------------------------- rows
def bench_row(kiln, dtype_name, d, seqlen, causal, args, model=None):
    """One row; `model` is a MODEL_ROWS entry (its batch, heads and heads_kv) or None."""
    dtype = DTYPES[dtype_name]
    name, batch, heads, heads_kv = ((model[0], model[1], model[3], model[4]) if model
                                    else (None, None, None, None))
    q, k, v, out = make_inputs(dtype, d, seqlen, args.layout, batch, heads, heads_kv)
    batch, _, heads, _ = q.shape
    heads_kv = k.shape[2]
    row = {"dtype": dtype_name, "head_dim": d, "seqlen": seqlen, "batch": batch, "heads": heads,
           "heads_kv": heads_kv, "model": name, "causal": causal,
           "flops": row_flops(batch, heads, seqlen, d, causal), "errors": {}}
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    out8, out_fp8 = torch.empty_like(out), torch.empty_like(out)
    calls = {"kiln": lambda: kiln.flash_attn_func(q, k, v, causal=causal, out=out)}
    if reads_fp8():
        calls["kiln_e4m3"] = lambda: kiln.flash_attn_func(q, k8, v8, causal=causal, out=out8)
    if all_fp8(d):
        calls["kiln_fp8"] = lambda: kiln.flash_attn_func(q8, k8, v8, causal=causal, out=out_fp8)

    # SDPA's fused kernels need as many kv heads as query heads: repeat them (not timed).
    def for_sdpa(k, v):
        return ((k.repeat_interleave(heads // heads_kv, dim=2),
                 v.repeat_interleave(heads // heads_kv, dim=2)) if heads_kv != heads else (k, v))
    calls.update({n: sdpa_call(b, q, *for_sdpa(k, v), causal) for n, b in SDPA_BACKENDS.items()})
    row = time_row(row, calls, out, args)
    # e4m3's output against SDPA's over the values e4m3 holds (exact in the row's dtype).
    dequantized = {n: sdpa_call(b, q, *for_sdpa(k8.to(dtype), v8.to(dtype)), causal)
                   for n, b in SDPA_BACKENDS.items() if n in calls}
    if "kiln_e4m3" in calls:  # warm_up drops a call that raised, keeping its message
        dequantized["kiln"] = calls["kiln_e4m3"]
        row["check_e4m3"] = check_row(dequantized, out8, args.tol, lambda t: t.transpose(1, 2))
    elif reads_fp8():
        row["check_e4m3"] = {"ref": None, "max_abs_diff": None, "ok": False,
                             "error": row["errors"].get("kiln_e4m3", "kiln e4m3 did not run")}
    if all_fp8(d):
        fp8 = {n: sdpa_call(b, q8.to(dtype), *for_sdpa(k8.to(dtype), v8.to(dtype)), causal)
               for n, b in SDPA_BACKENDS.items() if n in calls}
        fp8["kiln"] = calls.get("kiln_fp8", calls["kiln"])
        tol = args.tol + v8.float().abs().max().item() / 16
        row["check_fp8"] = (check_row(fp8, out_fp8, tol, lambda t: t.transpose(1, 2))
                            if "kiln_fp8" in calls else
                            {"ref": None, "max_abs_diff": None, "ok": False,
                             "error": row["errors"].get("kiln_fp8", "kiln fp8 did not run")})
    return row


def all_fp8(d):
    """Whether the row has an fp8 column: the all-fp8 forward runs on sm_90a (head dims multiples
    of 16)."""
    return torch.cuda.get_device_capability() == (9, 0) and d % 16 == 0


def reads_fp8():
    """Whether this GPU takes fp8 k and v (sm_89 and newer); the e4m3 column is n/a elsewhere."""
    return torch.cuda.get_device_capability() >= (8, 9)


def bench_varlen_row(kiln, args):
    """The varlen batch: packed (total, heads, d) tokens, cu_seqlens from VARLEN_LENGTHS."""
    d, heads, lengths = 128, 16, VARLEN_LENGTHS
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    cu = torch.tensor(offsets, device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(offsets[-1], heads, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out = torch.empty_like(q)
    longest = max(lengths)
    row = {"dtype": "bf16", "head_dim": d, "seqlen": longest, "batch": len(lengths),
           "heads": heads, "heads_kv": heads, "model": "varlen-mixed", "causal": True,
           "flops": sum(row_flops(1, heads, n, d, True) for n in lengths), "errors": {}}
    calls = {"kiln": lambda: kiln.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                         causal=True, out=out)}
    # (batch, jagged tokens, heads, d) nested tensors, transposed for SDPA as in sdpa_call.
    nested = [torch.nested.nested_tensor_from_jagged(t, offsets=cu.long()) for t in (q, k, v)]
    calls.update({n: sdpa_call(b, *nested, True) for n, b in SDPA_BACKENDS.items()})
    return time_row(row, calls, out, args, lambda t: t.transpose(1, 2).values())


def time_row(row, calls, out, args, unpack=lambda t: t.transpose(1, 2)):
    """Warms and times `calls` into `row`, with the ratios and the check (`unpack` takes an
    SDPA output to kiln's layout)."""
    row["first_call_ms"] = warm_up(calls, row["errors"])
    ms = time_interleaved(calls, args.reps, row["errors"])
    row["ms"] = {n: ms.get(n) for n in BACKENDS}
    row["tflops"] = {n: (row["flops"] / t / 1e9 if t else None) for n, t in row["ms"].items()}
    row["e4m3_over_kiln"] = ratio(row["tflops"], "kiln_e4m3", "kiln")
    row["fp8_over_kiln"] = ratio(row["tflops"], "kiln_fp8", "kiln")
    row["kiln_over_flash"] = ratio(row["tflops"], "kiln", "flash")
    row["kiln_over_cudnn"] = ratio(row["tflops"], "kiln", "cudnn")
    row["check"] = check_row(calls, out, args.tol, unpack)
    return row


def check_row(calls, out, tol, unpack):
    """kiln's output against the first SDPA backend that ran, once, with out poisoned first.

    NaN in out means kiln left an element unwritten; it fails the check like a wrong value.
    """
    ref_name = next((n for n in REFERENCE_ORDER if n in calls), None)
    if "kiln" not in calls or ref_name is None:
        return {"ref": ref_name, "max_abs_diff": None, "ok": None}
    out.fill_(float("nan"))
    try:
        calls["kiln"]()
        expected = unpack(calls[ref_name]())
    except Exception as ex:  # it ran while timed: failing now is as bad as a wrong answer
        return {"ref": ref_name, "max_abs_diff": None, "ok": False, "error": describe(ex)}
    diff = (out.float() - expected.float()).abs().max().item()
    return {"ref": ref_name, "max_abs_diff": diff, "ok": bool(diff < tol)}


# ---------------------------------------------------------------------------------- cold call
def measure_cold(kiln):
    """First-call times: the runtime's start in this process, then one fresh variant.

    The first variant absorbs the one-time costs (loading NVRTC, reading kernel sources), so
    the second, a different dtype, head dim and mask, times the compile of one attention
    variant plus its first run, which is what a user meets for a new shape. Small problems
    keep the run itself under a millisecond. A failure is kept as a message: the table still
    runs and shows which rows kiln can do.
    """
    def first_call(dtype, d, causal):
        q, k, v, out = make_inputs(dtype, d, 512, "bshd")
        try:
            return wall_ms(lambda: kiln.flash_attn_func(q, k, v, causal=causal, out=out)), None
        except kiln.KilnError as ex:
            return None, describe(ex)
    process_ms, process_err = first_call(torch.float16, 64, False)
    cold_ms, cold_err = first_call(torch.bfloat16, 128, True)
    return {"process_first_call_ms": process_ms, "process_error": process_err,
            "variant": "bf16 d128 causal", "cold_ms": cold_ms, "cold_error": cold_err,
            "cache_dir": os.environ.get("KILN_CACHE_DIR")}


def print_cold(cold, empty):
    note = {True: "empty cache", False: "CACHE NOT EMPTY: may be a cache hit",
            None: "KILN_CACHE_DIR unset: may be a cache hit"}[empty]
    first = (f"{cold['process_first_call_ms']:.0f} ms" if cold["process_error"] is None
             else f"FAILED: {cold['process_error']}")
    print(f"first kiln call in this process (runtime start + compile + run): {first}")
    result = (f"{cold['cold_ms']:.0f} ms ({note})" if cold["cold_error"] is None
              else f"FAILED: {cold['cold_error']}")
    print(f"cold compile+first call of {cold['variant']}: {result}")


def cache_was_empty():
    """True/False when KILN_CACHE_DIR is set (so we can tell), None when it is not."""
    path = os.environ.get("KILN_CACHE_DIR")
    if not path:
        return None
    return not os.path.isdir(path) or not any(os.scandir(path))


# ---------------------------------------------------------------------------------- printing
def header_lines(kiln, args):
    if args.layout == "bshd":
        layout = ("q/k/v are contiguous (batch, seqlen, heads, d) tensors: kiln reads them "
                  "as they are, SDPA gets .transpose(1, 2) views of the same storage")
    else:
        layout = ("q/k/v are contiguous (batch, heads, seqlen, d) tensors: SDPA reads them "
                  "as they are, kiln gets .transpose(1, 2) views of the same storage")
    return [
        device_line(),
        library_line(kiln),
        f"inputs: {layout}; no copies; kiln called as kiln.flash_attn_func(q, k, v, "
        f"causal=..., out=out)",
        f"timing: CUDA events around each call, median of {args.reps} calls per backend, "
        f"backends interleaved call by call, after warm-up until a call is fast",
        f"TFLOP/s: 4*batch*heads*seqlen^2*d (halved when causal); {TOKENS} tokens, "
        f"model dim {MODEL_DIM}; check: max |kiln - SDPA| < {args.tol:g} on randn inputs; "
        f"1st ms: kiln's first call on the row (a compile, a cache load or neither)",
    ]


TABLE_HEAD = (f"{'dtype':5} {'d':>3} {'seqlen':>6} {'causal':>6} | {'kiln':>6} {'e4m3':>6} "
              f"{'fp8':>6} {'flash':>6} {'cudnn':>6} {'effic':>6} | {'k/flash':>7} "
              f"{'k/cudnn':>7} {'e4/kiln':>7} {'f8/kiln':>7} | {'1st ms':>6} | check")


def verdict_of(chk):
    if chk["ok"] is None:
        return "n/a"
    if chk["ok"]:
        return f"ok {chk['max_abs_diff']:.1e}"
    if chk.get("error"):
        return f"CHECK FAILED: {chk['error'].splitlines()[0]} <<<<<<<<"
    return f"MISMATCH {chk['max_abs_diff']:.1e} vs {chk['ref']} <<<<<<<<"


def row_line(row):
    t = row["tflops"]
    verdict = verdict_of(row["check"])
    if "check_e4m3" in row:
        verdict += f", e4m3 {verdict_of(row['check_e4m3'])}"
    if "check_fp8" in row:
        verdict += f", fp8 {verdict_of(row['check_fp8'])}"
    label = f" {row['model']} b{row['batch']} h{row['heads']}/{row['heads_kv']}" if row.get(
        "model") else ""
    return (f"{row['dtype']:5} {row['head_dim']:>3} {row['seqlen']:>6} {str(row['causal']):>6} | "
            + " ".join(cell(t[n], "6.0f") for n in BACKENDS) + " | "
            + f"{cell(row['kiln_over_flash'], '7.2f')} {cell(row['kiln_over_cudnn'], '7.2f')} "
            + f"{cell(row['e4m3_over_kiln'], '7.2f')} {cell(row['fp8_over_kiln'], '7.2f')} | "
            + f"{cell(row['first_call_ms'].get('kiln'), '6.0f')} | {verdict}{label}")


def print_new_errors(row, seen):
    """Each distinct backend failure once: cuDNN may refuse a whole family of shapes."""
    for name, msg in row["errors"].items():
        if (name, msg) not in seen:
            seen.add((name, msg))
            print(f"    {name} n/a: {msg.splitlines()[0] if msg else msg}", flush=True)


def summarize(rows):
    def span(key):
        vals = [r[key] for r in rows if r[key] is not None]
        return {"min": min(vals) if vals else None, "max": max(vals) if vals else None,
                "rows": len(vals), "rows_ge_1": sum(v >= 1.0 for v in vals)}
    return {
        "kiln_over_flash": span("kiln_over_flash"),
        "kiln_over_cudnn": span("kiln_over_cudnn"),
        "e4m3_over_kiln": span("e4m3_over_kiln"),
        "fp8_over_kiln": span("fp8_over_kiln"),
        "mismatches": [row_name(r) for r in rows if r["check"]["ok"] is False
                       or r.get("check_e4m3", {}).get("ok") is False
                       or r.get("check_fp8", {}).get("ok") is False],
        "kiln_failed": [row_name(r) for r in rows if r["tflops"]["kiln"] is None],
    }


def row_name(r):
    model = f" {r['model']}" if r.get("model") else ""
    return f"{r['dtype']} d{r['head_dim']} s{r['seqlen']}{' causal' if r['causal'] else ''}{model}"


def summary_lines(s, total):
    kf, kc, ke = s["kiln_over_flash"], s["kiln_over_cudnn"], s["e4m3_over_kiln"]
    lines = [f"kiln/flash: min {cell(kf['min'], '.2f')} max {cell(kf['max'], '.2f')}, "
             f"{kf['rows_ge_1']} of {total} rows >= 1.0",
             f"kiln/cudnn: min {cell(kc['min'], '.2f')} max {cell(kc['max'], '.2f')}, "
             f"{kc['rows_ge_1']} of {total} rows >= 1.0",
             f"kiln e4m3/kiln: min {cell(ke['min'], '.2f')} max {cell(ke['max'], '.2f')}, "
             f"{ke['rows_ge_1']} of {ke['rows']} rows >= 1.0",
             f"kiln fp8/kiln: min {cell(s['fp8_over_kiln']['min'], '.2f')} "
             f"max {cell(s['fp8_over_kiln']['max'], '.2f')}, "
             f"{s['fp8_over_kiln']['rows_ge_1']} of {s['fp8_over_kiln']['rows']} rows >= 1.0"]
    if s["mismatches"]:
        lines.append(f"!!! OUTPUT MISMATCH on {len(s['mismatches'])} rows: "
                     + ", ".join(s["mismatches"]))
    if s["kiln_failed"]:
        lines.append(f"!!! kiln did not run on {len(s['kiln_failed'])} rows: "
                     + ", ".join(s["kiln_failed"]))
    return lines


# -------------------------------------------------------------------------------------- main
def main():
    args = parse_args()
    kiln, header = start(args, header_lines)

    empty = cache_was_empty()
    cold = measure_cold(kiln)
    cold["cache_was_empty"] = empty
    print_cold(cold, empty)
    if args.warm:
        t0 = time.perf_counter()
        kiln.warmup()
        cold["warmup_default_s"] = time.perf_counter() - t0
        print(f"kiln.warmup(): {cold['warmup_default_s']:.1f} s")

    print("\nTFLOP/s" + "\n" + TABLE_HEAD, flush=True)
    rows, seen = [], set()
    grid = [(dt, d, s, c, None) for dt, d, s, c in (QUICK_ROWS if args.quick else all_rows())]
    models = [] if args.quick else [("bf16", m[5], m[2], True, m) for m in MODEL_ROWS]
    grid = [] if args.rows == "models" else grid
    models = [] if args.rows == "grid" else models
    row_calls = [lambda g=g: bench_row(kiln, *g[:4], args, g[4]) for g in grid + models]
    if not args.quick and args.rows != "grid":
        row_calls.append(lambda: bench_varlen_row(kiln, args))
    for bench in row_calls:
        row = bench()
        rows.append(row)
        print(row_line(row), flush=True)
        print_new_errors(row, seen)
        if args.warm and row["first_call_ms"].get("kiln", 0) > COMPILED_MS:
            print(f"    kiln first call {row['first_call_ms']['kiln']:.0f} ms: "
                  f"kernel not covered by kiln.warmup()?")
        torch.cuda.empty_cache()

    summary = summarize(rows)
    print()
    for line in summary_lines(summary, len(rows)):
        print(line)
    save_results("attention.json", {"header": header, "args": vars(args), "cold": cold,
                                    "rows": rows, "summary": summary})
    return 1 if summary["mismatches"] or summary["kiln_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
