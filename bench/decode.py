# SPDX-License-Identifier: Apache-2.0
"""Decode attention benchmark: kiln's flash_attn_with_kvcache (its Python package) on a
contiguous and on paged KV caches, next to PyTorch SDPA's flash and cuDNN backends on the same
keys, in one process on one GPU (issue 4, "Performance"; issue 16: the package reaches the C
API's TB/s).

    KILN_LIB=build KILN_CACHE_DIR=$(mktemp -d) python3 bench/decode.py [--quick]

Rows: bf16, 32 query heads on 8 kv heads, head dim 128, one query per sequence, (batch, cache
length) 1x32768, 8x8192, 32x4096, 64x16384, 128x2048, every sequence at the full length.
Decode reads K and V once, so it is measured as bandwidth: batch * length * heads_kv * d *
2 bytes * 2 (K and V) over the time, in TB/s. kiln runs on a contiguous cache and on paged
caches of 16 and 256 keys a page whose block tables are random permutations. SDPA takes
(batch, heads_kv, length, d) views of the contiguous cache with enable_gqa=True; a backend that
refuses that gets K and V repeated to 32 heads, and the row says so (it then reads 4x the
bytes the TB/s count). kiln also reads the same keys from an fp8 (e4m3) cache, contiguous and
paged by 16 and 256 ("kiln e4m3", "kiln e4m3 p16", "kiln e4m3 p256", issue 32): the inputs are
drawn as e4m3 values, so every column attends the same numbers, and those columns' TB/s count
their 1-byte elements; e4m3/bf16 is kiln's bf16 time over its e4m3 time, the tokens-per-second
ratio, and the summary gives each paged cache's TB/s over its contiguous one's. Every backend
takes turns over --sets independent sets of inputs (2 by
default), so a call never reads the K and V that the call before it read: the L2 (50 MB on an
H100, 60 on an H200) cannot hold a row's K and V, but would otherwise keep whatever of them it
happens to keep from one call to the next. Each row checks every kiln output of every set
against SDPA's; a mismatch, or a row kiln could not run, makes the exit status 1. With $OUT
set, the results go to $OUT/decode.json.
"""
import argparse
import functools
import itertools
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (cell, describe, device_line, library_line, ratio,  # noqa: E402
                          save_results, start, time_interleaved, warm_up)

HEADS, HEADS_KV, HEAD_DIM, DTYPE, FP8 = 32, 8, 128, torch.bfloat16, torch.float8_e4m3fn
ROWS = [(1, 32768), (8, 8192), (32, 4096), (64, 16384), (128, 2048)]
QUICK_ROWS = [(1, 32768), (32, 4096)]
PAGE_SIZES = (16, 256)
KILN = (["kiln"] + [f"kiln p{p}" for p in PAGE_SIZES] + ["kiln e4m3"]
        + [f"kiln e4m3 p{p}" for p in PAGE_SIZES])
SDPA_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
BACKENDS = KILN + list(SDPA_BACKENDS)
# A GPU spin before each timed sample (about 3 ms), longer than the host needs to queue the
# sample's calls: SDPA's dispatch alone can take longer than the shortest rows' kernels.
SLEEP_CYCLES = 5_000_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"rows {QUICK_ROWS} only")
    p.add_argument("--samples", type=int, default=10, help="timed samples per backend and row")
    p.add_argument("--per-sample", type=int, default=20, help="calls per timed sample")
    p.add_argument("--sets", type=int, default=2,
                   help="independent input sets the calls take turns over (default 2)")
    p.add_argument("--rows", default=None,
                   help="comma-separated BATCHxLENGTH rows instead of the default ones")
    p.add_argument("--lib", default=None, help="libkiln.so or its build dir (default $KILN_LIB; "
                   "neither: the installed package's, else ./build's)")
    p.add_argument("--splits", type=int, default=0,
                   help="kiln's num_splits (default 0: its heuristic)")
    p.add_argument("--tol", type=float, default=2e-2,
                   help="max |kiln - SDPA| relative to max |SDPA| (default 2e-2)")
    args = p.parse_args()
    if args.sets < 1:
        p.error(f"--sets is {args.sets}: at least one input set is needed")
    if args.rows:
        given = args.rows
        try:
            args.rows = [tuple(int(x) for x in r.split("x")) for r in given.split(",")]
        except ValueError:
            args.rows = None
        if not args.rows or any(len(r) != 2 or min(r) < 1 for r in args.rows):
            p.error(f"--rows {given!r}: write rows as BATCHxLENGTH with both at least 1, e.g. "
                    "1x32768,8x8192")
    return args


# ------------------------------------------------------------------------------------- inputs
def make_cache(batch, length):
    """q (batch, 1, heads, d) and a full contiguous cache k, v (batch, length, heads_kv, d):
    fresh random values, as zeros would make every backend agree whatever it computed; k and v
    hold e4m3 values, so that the fp8 columns read the same numbers."""
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = (torch.randn(batch, length, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
            .to(FP8).to(DTYPE) for _ in range(2))
    seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    return q, k, v, seqlens


def paged(k, v, page_size):
    """k and v copied into pages of page_size keys handed out in a random order: (k_pages,
    v_pages, block_table), page block_table[b][p] holding keys p * page_size ... of sequence b."""
    batch, length = k.shape[:2]
    pages = batch * length // page_size
    block_table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, -1)
    where = block_table.flatten().long()
    out = []
    for t in (k, v):
        p = torch.empty(pages, page_size, HEADS_KV, HEAD_DIM, device="cuda", dtype=t.dtype)
        p[where] = t.reshape(pages, page_size, HEADS_KV, HEAD_DIM)
        out.append(p)
    return out[0], out[1], block_table


def kiln_calls(kiln, q, k, v, seqlens, splits):
    """Each kiln variant's bound call and the out tensor it writes."""
    calls, outs = {}, {}
    caches = {"kiln": (k, v, None)}
    caches.update({f"kiln p{p}": paged(k, v, p) for p in PAGE_SIZES})
    k8, v8 = k.to(FP8), v.to(FP8)  # exact: k and v hold e4m3 values
    caches["kiln e4m3"] = (k8, v8, None)
    caches.update({f"kiln e4m3 p{p}": paged(k8, v8, p) for p in PAGE_SIZES})
    for name, (kc, vc, table) in caches.items():
        outs[name] = torch.empty_like(q)
        calls[name] = functools.partial(kiln.flash_attn_with_kvcache, q, kc, vc,
                                        cache_seqlens=seqlens, block_table=table,
                                        num_splits=splits, out=outs[name])
    return calls, outs


def sdpa_call(backend, q, k, v, gqa):
    """SDPA restricted to one backend; q (batch, heads, 1, d). Not causal: SDPA aligns its mask
    top-left, which would leave one query one key."""
    def call():
        with sdpa_kernel([backend]):
            if gqa:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            return F.scaled_dot_product_attention(q, k, v)
    return call


def first_run(call):
    """Runs call once; on failure raises a RuntimeError whose message is the failure's, with
    torch's warnings (why a backend refused) after it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            call()
        except Exception as ex:
            reasons = "; ".join(str(w.message).splitlines()[0] for w in caught)
            raise RuntimeError(f"{describe(ex)}{' (' + reasons + ')' if reasons else ''}") from ex


def sdpa_calls(q, k, v, row):
    """Each SDPA backend's call on views of the contiguous cache with enable_gqa=True, else on
    K and V repeated to all heads; a backend that runs neither goes to row["errors"]."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    calls, repeated = {}, None
    for name, backend in SDPA_BACKENDS.items():
        try:
            calls[name] = sdpa_call(backend, qt, kt, vt, gqa=True)
            first_run(calls[name])
            row["sdpa_kv"][name] = "gqa"
            continue
        except Exception as ex:
            del calls[name]
            gqa_error = str(ex)
        if repeated is None:
            repeated = [t.repeat_interleave(HEADS // HEADS_KV, dim=1) for t in (kt, vt)]
        try:
            calls[name] = sdpa_call(backend, qt, *repeated, gqa=False)
            first_run(calls[name])
            row["sdpa_kv"][name] = f"repeated to {HEADS} heads (enable_gqa: {gqa_error})"
        except Exception as ex:
            del calls[name]
            row["errors"][name] = f"enable_gqa: {gqa_error}; repeated K/V: {ex}"
    return calls


# ---------------------------------------------------------------------------------------- rows
def taking_turns(calls):
    """One call that runs calls[0], calls[1], ... in turn, one per call."""
    turn = itertools.count()
    return lambda: calls[next(turn) % len(calls)]()


def bench_row(kiln, batch, length, args):
    row = {"batch": batch, "length": length, "bytes": batch * length * HEADS_KV * HEAD_DIM * 2 * 2,
           "errors": {}, "sdpa_kv": {}, "sets": args.sets}
    sets = []
    for _ in range(args.sets):
        q, k, v, seqlens = make_cache(batch, length)
        calls, outs = kiln_calls(kiln, q, k, v, seqlens, args.splits)
        calls.update(sdpa_calls(q, k, v, row))
        sets.append((calls, outs, q, k, v))
    calls = sets[0][0]
    row["first_call_ms"] = warm_up(calls, row["errors"])
    timed = {n: taking_turns([c[n] for c, *_ in sets]) for n in calls}
    ms = time_interleaved(timed, args.samples, row["errors"], per_sample=args.per_sample,
                          sleep_cycles=SLEEP_CYCLES)
    row["ms"] = {n: ms.get(n) for n in BACKENDS}
    row["tbps"] = {n: (row["bytes"] / (2 if "e4m3" in n else 1) / t / 1e9 if t else None)
                   for n, t in row["ms"].items()}
    row["e4m3_over_bf16"] = (row["ms"]["kiln"] / row["ms"]["kiln e4m3"]
                             if row["ms"]["kiln"] and row["ms"]["kiln e4m3"] else None)
    row["kiln_over_flash"] = ratio(row["tbps"], "kiln", "flash")
    row["kiln_over_cudnn"] = ratio(row["tbps"], "kiln", "cudnn")
    row["check"] = worst_check([check_row(c, o, *t, args.tol) for c, o, *t in sets])
    return row


def worst_check(checks):
    """Of one row's checks (a set each), the first that failed, else the largest difference."""
    failed = [c for c in checks if c["ok"] is False]
    if failed:
        return failed[0]
    return max(checks, key=lambda c: max(c["rel_diff"].values(), default=0.0))


def check_row(calls, outs, q, k, v, tol):
    """Every kiln output against the first SDPA backend that ran (SDPA's math backend if none
    did), once, with out poisoned first: NaN left in out fails like a wrong value."""
    ref_name = next((n for n in SDPA_BACKENDS if n in calls), "math")
    ref_call = calls.get(ref_name) or sdpa_call(SDPBackend.MATH, q.transpose(1, 2),
                                                k.transpose(1, 2), v.transpose(1, 2), gqa=True)
    check = {"ref": ref_name, "rel_diff": {}, "ok": None, "error": None}
    try:
        expected = ref_call().transpose(1, 2).float()
        scale = expected.abs().max().item()
        for name in (n for n in KILN if n in calls):
            outs[name].fill_(float("nan"))
            calls[name]()
            check["rel_diff"][name] = (outs[name].float() - expected).abs().max().item() / scale
    except Exception as ex:  # it ran while timed: failing now is as bad as a wrong answer
        check.update(ok=False, error=describe(ex))
        return check
    if check["rel_diff"]:
        # NaN compares False, so a NaN difference fails.
        check["ok"] = all(d < tol for d in check["rel_diff"].values())
    return check


# ---------------------------------------------------------------------------------- printing
def header_lines(kiln, args):
    return [
        device_line(),
        library_line(kiln),
        f"bf16, {HEADS} query heads, {HEADS_KV} kv heads, d {HEAD_DIM}, seqlen_q 1, every "
        f"sequence at the full cache length; kiln num_splits {args.splits or 'heuristic'}",
        "kiln: contiguous cache (batch, length, heads_kv, d), and paged caches (p16, p256) with "
        "random-permutation block tables; SDPA: (batch, heads_kv, length, d) views of the "
        "contiguous cache, enable_gqa=True unless noted",
        f"timing: CUDA events around {args.per_sample} back-to-back calls after a GPU spin, "
        f"the calls taking turns over {args.sets} input sets, median of {args.samples} samples "
        f"per backend, backends taking turns, after warm-up until a call is fast",
        f"TB/s: batch*length*{HEADS_KV}*{HEAD_DIM}*2 bytes*2 (K and V) / time (1 byte for the "
        f"e4m3 columns); check: "
        f"max |kiln - SDPA| / max |SDPA| < {args.tol:g} for every kiln column",
    ]


TABLE_HEAD = ("| batch x length | " + " | ".join(BACKENDS) + " | kiln/flash | kiln/cudnn "
              "| e4m3/bf16 | kiln 1st ms | check | notes |")
TABLE_RULE = "|" + "---|" * (len(BACKENDS) + 7)


def verdict(check):
    if check.get("error"):
        return f"FAIL: {check['error'].splitlines()[0]}"
    if check["ok"] is None:
        return "n/a"
    worst = max(check["rel_diff"].values())
    return f"{'ok' if check['ok'] else 'FAIL'} {worst:.1e} vs {check['ref']}"


def notes(row):
    """Why a cell is n/a, and how SDPA got K and V when not through enable_gqa."""
    out = [f"{n}: {m}" for n, m in row["sdpa_kv"].items() if m != "gqa"]
    out += [f"{n} n/a: {m.splitlines()[0][:160]}" for n, m in row["errors"].items()]
    return "; ".join(out).replace("|", "/")


def row_line(row):
    t = row["tbps"]
    return (f"| {row['batch']} x {row['length']} | "
            + " | ".join(cell(t[n], ".2f") for n in BACKENDS) + " | "
            + f"{cell(row['kiln_over_flash'], '.2f')} | {cell(row['kiln_over_cudnn'], '.2f')} | "
            + f"{cell(row['e4m3_over_bf16'], '.2f')} | "
            + f"{cell(row['first_call_ms'].get('kiln'), '.0f')} | {verdict(row['check'])} | "
            + f"{notes(row)} |")


def summary_lines(rows):
    lines = []
    for key, name in (("kiln_over_flash", "kiln/flash"), ("kiln_over_cudnn", "kiln/cudnn"),
                      ("e4m3_over_bf16", "kiln e4m3/bf16")):
        vals = [r[key] for r in rows if r[key] is not None]
        lines.append(f"{name}: min {cell(min(vals) if vals else None, '.2f')} max "
                     f"{cell(max(vals) if vals else None, '.2f')}, "
                     f"{sum(x >= 1.0 for x in vals)} of {len(rows)} rows >= 1.0")
    # Paged over contiguous, each cache dtype (issue 32: an fp8 cache paged within 5%).
    for dtype in ("kiln", "kiln e4m3"):
        for p in PAGE_SIZES:
            vals = [r["tbps"][f"{dtype} p{p}"] / r["tbps"][dtype] for r in rows
                    if r["tbps"][f"{dtype} p{p}"] and r["tbps"][dtype]]
            lines.append(f"{dtype} p{p}/contiguous: min {cell(min(vals) if vals else None, '.2f')}"
                         f" max {cell(max(vals) if vals else None, '.2f')}")
    failed = [f"{r['batch']}x{r['length']}" for r in rows if r["check"]["ok"] is False]
    missing = [f"{r['batch']}x{r['length']} {n}" for r in rows for n in KILN
               if r["tbps"][n] is None]
    if failed:
        lines.append(f"!!! FAIL: kiln's output off on {len(failed)} rows: " + ", ".join(failed))
    if missing:
        lines.append("!!! kiln did not run: " + ", ".join(missing))
    return lines, bool(failed or missing)


# -------------------------------------------------------------------------------------- main
def main():
    args = parse_args()
    kiln, header = start(args, header_lines)
    print("\n" + TABLE_HEAD + "\n" + TABLE_RULE, flush=True)
    rows = []
    for batch, length in args.rows or (QUICK_ROWS if args.quick else ROWS):
        rows.append(bench_row(kiln, batch, length, args))
        print(row_line(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    lines, bad = summary_lines(rows)
    print()
    for line in lines:
        print(line)
    save_results("decode.json", {"header": header, "args": vars(args), "rows": rows,
                                 "summary": lines})
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
