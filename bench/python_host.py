# SPDX-License-Identifier: Apache-2.0
"""Host cost per call from Python of a decode step: kiln's Python calls next to
torch.nn.functional.scaled_dot_product_attention, in one process on one GPU (issue 16,
"Performance": under 10 us a call without CUDA graphs).

    KILN_LIB=build python3 bench/python_host.py [--reps 100]

Rows: bf16 decode steps, one query per sequence, 32 query heads on 8 kv heads, head dim 128,
(batch, cache length) 1x4096 and 32x4096, every sequence at the full length, and the same 32
sequences in a paged cache of 256 keys a page. Calls: kiln.flash_attn_with_kvcache (the decode
kernel) with a new output and with out=, kiln.flash_attn_func on the same q, k and v, SDPA on
(batch, heads, seqlen, d) views of the same cache with enable_gqa=True, and torch.add of two
small tensors (the cost of any one-kernel torch op, for scale). Per call, medians:

- host us: the CPU time of one call, with the GPU busy: --calls calls queued behind a GPU spin
  (torch.cuda._sleep), timed by perf_counter, no synchronization, divided by their number. A
  sample counts only if the spin outlasted it, so no call waited for the GPU. This is what a
  call costs the Python thread, and what the 10 us target is about.
- kernel us: the GPU time of the call's kernels, CUDA events around the call, recorded after a
  GPU spin so the host has queued the whole call before the first event fires.
- wall us: perf_counter around the call and torch.cuda.synchronize(), the GPU idle before it;
  wall - kernel is what a synchronous caller waits beyond the kernels: the host cost, the
  launch latency and the synchronization's own.

With $OUT set, the results go to $OUT/python_host.json.
"""

import argparse
import functools
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (cell, describe, device_line, library_line,  # noqa: E402
                          save_results, start, warm_up)

HEADS, HEADS_KV, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
ROWS = [(1, 4096, None), (32, 4096, None), (32, 4096, 256)]  # (batch, length, page size)
# GPU spins in clock cycles: longer than --calls calls take to queue (checked per sample), and
# than one call takes to queue before its kernel-time events.
SPIN_CALLS = 10_000_000
SPIN_KERNEL = 2_000_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=100, help="samples per call and measure")
    p.add_argument("--calls", type=int, default=100, help="calls per host-time sample")
    p.add_argument(
        "--lib",
        default=None,
        help="libkiln.so or its build dir (default $KILN_LIB; "
        "neither: the installed package's, else ./build's)",
    )
    return p.parse_args()


# ------------------------------------------------------------------------------------- inputs
def make_calls(kiln, batch, length, page_size):
    """The row's calls by name, on fresh random inputs (zeros would hide nothing here, but the
    other benchmarks' rule holds: real values)."""
    q = torch.randn(batch, 1, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    k, v = (
        torch.randn(batch, length, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE) for _ in range(2)
    )
    seqlens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
    out = torch.empty_like(q)
    if page_size:
        pages = batch * length // page_size
        table = torch.randperm(pages, device="cuda").to(torch.int32).view(batch, -1)
        k_pages, v_pages = (
            torch.empty(pages, page_size, HEADS_KV, HEAD_DIM, device="cuda", dtype=DTYPE)
            for _ in range(2)
        )
        k_pages[table.flatten().long()] = k.reshape(pages, page_size, HEADS_KV, HEAD_DIM)
        v_pages[table.flatten().long()] = v.reshape(pages, page_size, HEADS_KV, HEAD_DIM)
        decode = functools.partial(
            kiln.flash_attn_with_kvcache,
            q,
            k_pages,
            v_pages,
            cache_seqlens=seqlens,
            block_table=table,
        )
        return {
            "kiln with_kvcache": decode,
            "kiln with_kvcache out=": functools.partial(decode, out=out),
        }
    decode = functools.partial(kiln.flash_attn_with_kvcache, q, k, v, cache_seqlens=seqlens)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    a, b = torch.randn(2, 1024, device="cuda").unbind()
    return {
        "kiln with_kvcache": decode,
        "kiln with_kvcache out=": functools.partial(decode, out=out),
        "kiln flash_attn_func": functools.partial(kiln.flash_attn_func, q, k, v),
        "sdpa": functools.partial(F.scaled_dot_product_attention, qt, kt, vt, enable_gqa=True),
        "torch.add": functools.partial(torch.add, a, b),
    }


# ---------------------------------------------------------------------------------- measures
def host_us(fn, reps, calls):
    """Median CPU us per call over samples of `calls` calls queued behind a GPU spin; a sample
    whose calls outlasted the spin (the GPU went idle, so a call may have waited) is dropped.
    None when every sample was."""
    samples = []
    for _ in range(reps):
        torch.cuda._sleep(SPIN_CALLS)
        spun = torch.cuda.Event()
        spun.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        if not spun.query():  # still spinning: no call waited for the GPU
            samples.append((t1 - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples) if samples else None


def kernel_us(fn, reps):
    """Median GPU us of one call's kernels, from CUDA events queued behind a spin."""
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for start_event, end_event in events:
        torch.cuda._sleep(SPIN_KERNEL)
        start_event.record()
        fn()
        end_event.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def wall_us(fn, reps):
    """Median us of one call plus torch.cuda.synchronize(), the GPU idle before it."""
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def bench_row(kiln, batch, length, page_size, args):
    row = {"batch": batch, "length": length, "page_size": page_size, "errors": {}, "calls": {}}
    calls = make_calls(kiln, batch, length, page_size)
    warm_up(calls, row["errors"])
    for name, fn in calls.items():
        try:
            host = host_us(fn, args.reps, args.calls)
            kernel = kernel_us(fn, args.reps)
            wall = wall_us(fn, args.reps)
        except Exception as ex:  # a call that ran while warming up should not fail now
            row["errors"][name] = describe(ex)
            continue
        row["calls"][name] = {
            "host_us": host,
            "kernel_us": kernel,
            "wall_us": wall,
            "wall_minus_kernel_us": wall - kernel,
        }
    return row


# ---------------------------------------------------------------------------------- printing
def header_lines(kiln, args):
    return [
        f"{device_line()}, Python {sys.version.split()[0]}",
        library_line(kiln),
        f"bf16 decode steps: {HEADS} query heads, {HEADS_KV} kv heads, d {HEAD_DIM}, seqlen_q 1",
        f"host us: CPU time per call, {args.calls} calls queued behind a GPU spin, median of "
        f"{args.reps} samples; kernel us: CUDA events around one call queued behind a spin; "
        f"wall us: one call plus torch.cuda.synchronize(); medians of {args.reps}",
    ]


TABLE_HEAD = "| row | call | host us | kernel us | wall us | wall - kernel us |"
TABLE_RULE = "|---|---|---|---|---|---|"


def row_lines(row):
    label = f"{row['batch']} x {row['length']}" + (
        f" p{row['page_size']}" if row["page_size"] else ""
    )
    lines = []
    for name, m in row["calls"].items():
        lines.append(
            f"| {label} | {name} | {cell(m['host_us'], '.1f')} | "
            f"{m['kernel_us']:.1f} | {m['wall_us']:.1f} | "
            f"{m['wall_minus_kernel_us']:.1f} |"
        )
    lines += [
        f"| {label} | {name} | n/a: {msg.splitlines()[0][:120]} | | | |"
        for name, msg in row["errors"].items()
    ]
    return lines


def main():
    args = parse_args()
    kiln, header = start(args, header_lines)
    print("\n" + TABLE_HEAD + "\n" + TABLE_RULE, flush=True)
    rows = []
    for batch, length, page_size in ROWS:
        rows.append(bench_row(kiln, batch, length, page_size, args))
        for line in row_lines(rows[-1]):
            print(line, flush=True)
        torch.cuda.empty_cache()
    save_results("python_host.json", {"header": header, "args": vars(args), "rows": rows})
    failed = [
        f"{r['batch']}x{r['length']} {n}" for r in rows for n in r["errors"] if n.startswith("kiln")
    ]
    if failed:
        print("!!! kiln did not run: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
