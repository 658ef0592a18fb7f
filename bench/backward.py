# SPDX-License-Identifier: Apache-2.0
"""Backward attention benchmark (issue 31): kiln's backward (kiln.flash_attn_func through
autograd) next to PyTorch SDPA's flash, cuDNN and mem-efficient backends, backward alone and
forward + backward, in one process on one GPU; kiln also with deterministic=True.

    KILN_LIB=build KILN_CACHE_DIR=$(mktemp -d) python3 bench/backward.py [--quick]

Rows: those of bench/attention.py (bf16 and fp16, head dims 64/128/256, seqlen 1k/4k/16k at
16k tokens, model dim 2048, causal or not; then its model rows, causal), the grid of
shared/peers/peers_backward.py, which runs in the same device command. TFLOP/s count
FlashAttention's FLOPs: the forward's 4 * batch * heads * seqlen^2 * d (half when causal), the
backward 2.5 times that, forward + backward 3.5 times. Each row checks kiln's dq, dk and dv
against the first SDPA backend that ran (max abs difference over the gradients, relative to
their largest magnitude); a mismatch, or a row kiln could not run, makes the exit status 1.
With $OUT set, the results go to $OUT/backward.json.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention import DTYPES, MODEL_ROWS, SDPA_BACKENDS, all_rows, make_inputs, row_flops  # noqa: E402
from bench_common import (cell, describe, device_line, library_line, ratio,  # noqa: E402
                          save_results, start, time_interleaved, warm_up)

# kiln twice (nondeterministic default, deterministic), then SDPA's backends.
BACKENDS = ["kiln", "kiln_det"] + list(SDPA_BACKENDS)
REFERENCE_ORDER = ["flash", "cudnn", "efficient"]
QUICK_ROWS = [("bf16", 64, 1024, False), ("bf16", 128, 4096, True), ("fp16", 256, 1024, True)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rows only, for smoke tests")
    p.add_argument("--reps", type=int, default=10, help="timed calls per backend and row")
    p.add_argument("--rows", choices=["all", "grid", "models"], default="all",
                   help="the head-dim x seqlen grid, the model shapes, or both (default)")
    p.add_argument("--head-dims", type=int, nargs="+", default=None,
                   help="the grid's rows of these head dims only (default: every one)")
    p.add_argument("--lib", default=None, help="libkiln.so or its build dir (default $KILN_LIB)")
    p.add_argument("--tol", type=float, default=2e-2,
                   help="max abs diff of kiln's gradients vs SDPA's, relative to their largest")
    return p.parse_args()


def leaves(*tensors):
    return [t.detach().requires_grad_(True) for t in tensors]


def row_calls(kiln, q, k, v, dout, causal):
    """Per backend, (backward alone, forward + backward, gradients) closures over one row's
    inputs: q, k, v (batch, seqlen, heads, d) leaves; SDPA gets transposed views of the same
    storage and, under GQA, K and V repeated to every query head (not timed)."""
    heads, heads_kv = q.shape[2], k.shape[2]

    def kiln_forward(deterministic):
        return lambda: kiln.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)

    def sdpa_forward(backend):
        kt, vt = ((k.repeat_interleave(heads // heads_kv, dim=2),
                   v.repeat_interleave(heads // heads_kv, dim=2)) if heads != heads_kv
                  else (k, v))

        def forward():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q.transpose(1, 2), kt.transpose(1, 2), vt.transpose(1, 2),
                    is_causal=causal).transpose(1, 2)
        return forward

    forwards = {"kiln": kiln_forward(False), "kiln_det": kiln_forward(True)}
    forwards.update({n: sdpa_forward(b) for n, b in SDPA_BACKENDS.items()})
    calls = {}
    for name, forward in forwards.items():
        def make(forward):
            out = {}

            def backward():  # on the graph of the last forward
                if "graph" not in out:
                    out["graph"] = forward()
                return torch.autograd.grad(out["graph"], (q, k, v), dout, retain_graph=True)

            def both():
                return torch.autograd.grad(forward(), (q, k, v), dout)
            return backward, both
        calls[name] = make(forward)
    return calls


def check_grads(calls, tol):
    """kiln's gradients (default mode) against the first SDPA backend's, and deterministic
    mode's against the default's, bitwise, once."""
    ref = next((n for n in REFERENCE_ORDER if n in calls), None)
    if "kiln" not in calls or ref is None:
        return {"ref": ref, "rel_diff": None, "ok": None}
    try:
        got, want = calls["kiln"][1](), calls[ref][1]()
        det = [calls["kiln_det"][1]() for _ in range(2)] if "kiln_det" in calls else None
    except Exception as ex:  # it ran while timed: failing now is as bad as a wrong answer
        return {"ref": ref, "rel_diff": None, "ok": False, "error": describe(ex)}
    rel = max(((g.float() - w.float()).abs().max() / w.float().abs().max().clamp_min(1e-6)).item()
              for g, w in zip(got, want))
    same = None if det is None else all(torch.equal(a, b) for a, b in zip(*det))
    return {"ref": ref, "rel_diff": rel, "deterministic_bitwise": same,
            "ok": bool(rel < tol and same is not False)}


def bench_row(kiln, dtype_name, d, seqlen, causal, args, model=None):
    dtype = DTYPES[dtype_name]
    name, batch, heads, heads_kv = ((model[0], model[1], model[3], model[4]) if model
                                    else (None, None, None, None))
    q, k, v, _ = make_inputs(dtype, d, seqlen, "bshd", batch, heads, heads_kv)
    q, k, v = leaves(q, k, v)
    dout = torch.randn_like(q)
    batch, _, heads, _ = q.shape
    fwd = row_flops(batch, heads, seqlen, d, causal)
    row = {"dtype": dtype_name, "head_dim": d, "seqlen": seqlen, "batch": batch, "heads": heads,
           "heads_kv": k.shape[2], "model": name, "causal": causal, "flops_forward": fwd,
           "errors": {}}
    pairs = row_calls(kiln, q, k, v, dout, causal)
    for phase, index, factor in (("bwd", 0, 2.5), ("fwdbwd", 1, 3.5)):
        calls = {n: p[index] for n, p in pairs.items()}
        warm_up(calls, row["errors"])
        ms = time_interleaved(calls, args.reps, row["errors"])
        row[f"{phase}_ms"] = {n: ms.get(n) for n in BACKENDS}
        row[f"{phase}_tflops"] = {n: (factor * fwd / t / 1e9 if t else None)
                                  for n, t in row[f"{phase}_ms"].items()}
        row[f"{phase}_kiln_over_cudnn"] = ratio(row[f"{phase}_tflops"], "kiln", "cudnn")
    row["deterministic_cost"] = ratio(row["bwd_ms"], "kiln_det", "kiln")
    row["check"] = check_grads({n: p for n, p in pairs.items() if n not in row["errors"]},
                               args.tol)
    return row


def row_line(r):
    label = r["model"] or f"{r['dtype']} d{r['head_dim']} s{r['seqlen']}"
    cells = " ".join(cell(r["bwd_tflops"][n], "8.0f") for n in BACKENDS)
    both = " ".join(cell(r["fwdbwd_tflops"][n], "8.0f") for n in BACKENDS)
    check = r["check"]
    verdict = ("ok" if check["ok"] else "n/a" if check["ok"] is None
               else f"MISMATCH {check.get('rel_diff')}")
    return (f"{label:22} {str(r['causal']):6} {cells} | {both} | "
            f"{cell(r['bwd_kiln_over_cudnn'], '5.2f')} {cell(r['deterministic_cost'], '5.2f')} "
            f"{verdict}")


def main():
    args = parse_args()
    kiln, header = start(args, lambda kiln, args: [device_line(), library_line(kiln)])
    names = " ".join(f"{n:>8}" for n in BACKENDS)
    print(f"TFLOP/s, backward alone | forward + backward; then kiln/cuDNN (backward) and "
          f"deterministic/default time\n{'row':22} {'causal':6} {names} | {names} |")
    rows = []
    grid = [row for row in (QUICK_ROWS if args.quick else all_rows())
            if args.head_dims is None or row[1] in args.head_dims]
    if args.rows in ("all", "grid"):
        for dt, d, s, c in grid:
            rows.append(bench_row(kiln, dt, d, s, c, args))
            print(row_line(rows[-1]), flush=True)
    if args.rows in ("all", "models") and not args.quick:
        for model in MODEL_ROWS:
            rows.append(bench_row(kiln, "bf16", model[5], model[2], True, args, model))
            print(row_line(rows[-1]), flush=True)
    for r in rows:
        for backend, message in r["errors"].items():
            print(f"{row_line(r)[:29]} {backend}: {message}")
    save_results("backward.json", {"header": header, "args": vars(args), "rows": rows})
    failed = [r for r in rows if r["check"]["ok"] is False or "kiln" in r["errors"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
