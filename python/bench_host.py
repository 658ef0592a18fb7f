# SPDX-License-Identifier: Apache-2.0
"""Host cost of one kiln call from Python, measured on the CPU (no GPU needed): the time from
the Python call to kiln's return, kernel excluded.

The problems are decode and prefill shapes with batch 0 on tensors sent as device 0's (see
kiln._checks.cpu_device): kiln checks every shape, stride and dtype and returns before any launch,
so a call costs what it costs on a GPU minus the launch (and minus the difference between
allocating on the CPU and with torch's CUDA caching allocator, measured apart on a GPU).

    KILN_LIB=build/lib/libkiln.so PYTHONPATH=python python python/bench_host.py

Times are this thread's CPU time (time.thread_time), median of 7 runs of 20000 calls; the
numbers and the choice of ctypes they support are in kiln/_capi.py's docstring.
"""
import statistics
import sys
import time

import torch

import kiln
from kiln import _capi, _checks, ops


def per_call_us(fn, n=20000, runs=7):
    for _ in range(n // 10):
        fn()
    times = []
    for _ in range(runs):
        start = time.thread_time()
        for _ in range(n):
            fn()
        times.append((time.thread_time() - start) / n * 1e6)
    return statistics.median(times)


def main():
    _checks.cpu_device = (ops._GPU, 0)
    plain_eager = ops.eager
    ops.eager = lambda t: type(t) is torch.Tensor and not ops._is_compiling()
    bf16, i32 = torch.bfloat16, torch.int32
    batch, heads, heads_kv, d = 0, 32, 8, 128
    q = torch.empty(batch, 1, heads, d, dtype=bf16)
    k_cache = torch.empty(batch, 4096, heads_kv, d, dtype=bf16)
    v_cache = torch.empty_like(k_cache)
    k_new = torch.empty(batch, 1, heads_kv, d, dtype=bf16)
    seqlens = torch.empty(batch, dtype=i32)
    out = torch.empty_like(q)
    qp = torch.empty(batch, 512, heads, d, dtype=bf16)
    kp = torch.empty(batch, 512, heads_kv, d, dtype=bf16)

    rows = []

    def row(name, fn):
        rows.append((name, per_call_us(fn)))
        print(f"{rows[-1][1]:7.2f} us  {name}", flush=True)

    row("flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=, causal=True)",
        lambda: kiln.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new,
                                             cache_seqlens=seqlens, causal=True))
    row("  the same with out=",
        lambda: kiln.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, k_new,
                                             cache_seqlens=seqlens, causal=True, out=out))
    row("flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=) (no append)",
        lambda: kiln.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens))
    row("flash_attn_func(q, k, v, causal=True)",
        lambda: kiln.flash_attn_func(qp, kp, kp, causal=True))
    q_trained = qp.clone().requires_grad_()
    row("  the same with q.requires_grad (the forward, recording its backward)",
        lambda: kiln.flash_attn_func(q_trained, kp, kp, causal=True))
    forward_args = (q_trained, kp, kp, None, None, None, None, None, 0, 0, 0.0, True, -1, -1,
                    False, 0.0, None, False)
    row("  through the dispatcher: torch.ops.kiln.attention_forward",
        lambda: ops.attention_forward(*forward_args))
    args = (q, k_cache, v_cache, seqlens, out, None, k_new, k_new, None, None, None, None, None,
            0.0, True, -1, -1, False, 0.0, True, 0, None, None, None, None, None, None, None, [],
            [])
    row("  packing and kiln_attention_with_kvcache alone (ops._attention_with_kvcache)",
        lambda: ops._attention_with_kvcache(*args))
    real = _capi.attention_with_kvcache
    _capi.attention_with_kvcache = lambda *a: 0
    row("  packing alone (the C call replaced by a Python no-op)",
        lambda: ops._attention_with_kvcache(*args))
    _capi.attention_with_kvcache = real
    row("  through the dispatcher: torch.ops.kiln.attention_with_kvcache",
        lambda: ops.attention_with_kvcache(*args))
    row("  ctypes call overhead alone: kiln_version()", _capi.lib.kiln_version)
    row("  packing one tensor (kiln.ops._tensor)", lambda: ops._tensor(0, q, "q"))
    # What a compiled extension would pay per tensor instead: nanobind's nb::ndarray caster
    # (nanobind 3.1, src/nb_ndarray.cpp) imports a torch tensor by calling its __dlpack__.
    row("  a nanobind extension's import of one tensor: q.__dlpack__(max_version=(1, 0))",
        lambda: q.__dlpack__(max_version=(1, 0)))
    row("torch.empty_like(q) (CPU; the CUDA caching allocator costs more)",
        lambda: torch.empty_like(q))
    ops.eager = plain_eager
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
