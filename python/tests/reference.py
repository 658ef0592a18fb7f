# SPDX-License-Identifier: Apache-2.0
"""Reference attention with FlashAttention's semantics, for testing kiln's kernels.

`attention_ref` mirrors flash_attn_func / flash_attn_varlen_func (plus kiln's extras: additive
bias, top-left band), `kvcache_ref` mirrors flash_attn_with_kvcache, and `check_close` applies
FlashAttention's tolerance rule. With upcast=True everything is computed in float64 (the
"exact" answer); with upcast=False in the inputs' dtype, the plain computation whose error sets
the tolerance: a kernel may be off from the float64 answer by at most twice as much as the plain
computation is, plus atol.

Semantics (as FlashAttention, and as kiln's kernels):
- scores = softmax_scale * q k^T, softmax_scale defaulting to 1 / sqrt(head_dim);
- softcap > 0: logits = softcap * tanh(scores / softcap);
- ALiBi: logits -= slope * |i + offset - j|;
- additive bias: logits += bias;
- the band: query i sees key j when i + offset - left <= j <= i + offset + right, where
  offset = seqlen_k - seqlen_q (bottom-right) or 0 (top_left), a negative bound is unbounded,
  and causal sets right = 0 keeping left;
- a row that sees no key gives output 0 and LSE -inf, and zero gradients;
- sinks (h): each row's softmax denominator gains exp(sink) with no value (gpt-oss), and the
  LSE counts it (a row that sees no key gets LSE = sink);
- GQA / MQA: query head h reads kv head h // (heads / heads_kv).
"""

import math

import torch


def _as_list(x, batch):
    """Per-sequence ints from an int, an int tensor (batch), or None."""
    if x is None:
        return [None] * batch
    if isinstance(x, int):
        return [x] * batch
    return [int(n) for n in x.tolist()]


def _attend(q, k, v, *, scale, causal, window_size, softcap, slopes, bias, top_left, dtype,
            sinks, p_fp8):
    """One sequence: q (s_q, h, d), k (s_k, h_kv, d), v (s_k, h_kv, d_v); slopes (h) or None;
    bias broadcastable to (h, s_q, s_k) or None; sinks (h) or None. Computes in `dtype`, with
    p_fp8 (an fp8 dtype) rounding each row's probabilities to it from 2^8 (the largest 256), as
    kiln's all-fp8 forward does; returns out (s_q, h, d_v) and lse (h, s_q)."""
    s_q, heads, _ = q.shape
    s_k, heads_kv, _ = k.shape
    if heads % heads_kv != 0:
        raise ValueError(f"heads {heads} is not a multiple of heads_kv {heads_kv}")
    group = heads // heads_kv
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)

    logits = torch.einsum("ihd,jhd->hij", q, k) * scale
    if softcap > 0:
        logits = torch.tanh(logits / softcap) * softcap
    i = torch.arange(s_q, device=q.device).view(s_q, 1)
    j = torch.arange(s_k, device=q.device).view(1, s_k)
    offset = 0 if top_left else s_k - s_q
    if slopes is not None:
        distance = (i + offset - j).abs().to(dtype)
        logits = logits - slopes.to(dtype).view(heads, 1, 1) * distance
    if bias is not None:
        logits = logits + bias.to(dtype)
    left, right = window_size
    if causal:
        right = 0
    outside = torch.zeros(s_q, s_k, dtype=torch.bool, device=q.device)
    if left >= 0:
        outside |= j < i + offset - left
    if right >= 0:
        outside |= j > i + offset + right
    logits = logits.masked_fill(outside, float("-inf"))
    if sinks is not None:  # one more column, of the sink's logit, whose weight is dropped
        sink = sinks.to(dtype).view(heads, 1, 1).expand(heads, s_q, 1)
        logits = torch.cat([logits, sink], dim=-1)

    lse = torch.logsumexp(logits, dim=-1)  # -inf for a row that sees no key (and no sink)
    empty = torch.isneginf(lse).unsqueeze(-1)
    # Not the NaN of 0/0: an empty row's probabilities are 0, and so (for autograd, whose
    # softmax backward would turn its NaN into every gradient) are its logits' gradients.
    probs = torch.softmax(logits.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    if p_fp8 is not None:
        live = logits.masked_fill(empty, 0.0)
        exps = torch.exp(live - live.amax(dim=-1, keepdim=True)).masked_fill(empty, 0.0)
        probs = (256 * exps).to(p_fp8).to(dtype) / 256 / exps.sum(-1, keepdim=True).clamp_min(1)
    out = torch.einsum("hij,jhd->ihd", probs[..., :s_k], v)
    return out, lse


def _options(q, upcast, softmax_scale, sinks, p_fp8=None, **band):
    """The per-sequence _attend options every call shares, and the LSE's dtype: float64 when
    upcast, else the inputs' dtype (float32 for the LSE, as kiln's)."""
    dtype, lse_dtype = (torch.float64, torch.float64) if upcast else (q.dtype, torch.float32)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return dict(scale=scale, dtype=dtype, sinks=sinks, p_fp8=p_fp8, **band), lse_dtype


def _slopes(alibi_slopes, b):
    """Sequence b's ALiBi slopes (heads) from (heads) or (batch, heads)."""
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[b]


def attention_ref(
    q,
    k,
    v,
    *,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    bias=None,
    top_left=False,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    seqused_k=None,
    sinks=None,
    upcast=True,
    p_fp8=None,
):
    """flash_attn_func (q (b, s_q, h, d), k and v (b, s_k, h_kv, d)) or, with cu_seqlens_q and
    cu_seqlens_k, flash_attn_varlen_func (q (total_q, h, d), k and v (total_k, h_kv, d)).
    seqused_k (b) keeps only the first seqused_k[b] keys of each sequence. alibi_slopes (h) or
    (b, h); bias broadcastable to (b, h, s_q, s_k), dense only; sinks (h). p_fp8: the plain
    computation's probabilities rounded as kiln's all-fp8 forward rounds them (_attend).

    Returns (out, lse): out like q with v's head dim, float64 when upcast else q's dtype; lse
    (b, h, s_q), or (h, total_q) with varlen, float64 when upcast else float32."""
    varlen = cu_seqlens_q is not None
    if varlen != (cu_seqlens_k is not None):
        raise ValueError("varlen needs both cu_seqlens_q and cu_seqlens_k")
    if varlen and bias is not None:
        raise ValueError("bias is dense only (kiln takes no bias with varlen)")
    band = dict(causal=causal, window_size=window_size, softcap=softcap, top_left=top_left)
    options, lse_dtype = _options(q, upcast, softmax_scale, sinks, p_fp8, **band)

    if varlen:
        starts_q = cu_seqlens_q.tolist()
        starts_k = cu_seqlens_k.tolist()
        batch = len(starts_q) - 1
        q_seqs = [q[starts_q[b] : starts_q[b + 1]] for b in range(batch)]
        k_rows = [(starts_k[b], starts_k[b + 1]) for b in range(batch)]
    else:
        batch = q.shape[0]
        q_seqs = [q[b] for b in range(batch)]
        k_rows = [(None, None)] * batch
    used = _as_list(seqused_k, batch)

    outs, lses = [], []
    for b in range(batch):
        begin, end = k_rows[b]
        k_b = k[begin:end] if varlen else k[b]
        v_b = v[begin:end] if varlen else v[b]
        if used[b] is not None:
            k_b, v_b = k_b[: used[b]], v_b[: used[b]]
        bias_b = None
        if bias is not None:
            full = bias.expand(batch, q.shape[2], q.shape[1], k.shape[1])
            bias_b = full[b, :, :, : k_b.shape[0]]
        out_b, lse_b = _attend(
            q_seqs[b], k_b, v_b, slopes=_slopes(alibi_slopes, b), bias=bias_b, **options
        )
        outs.append(out_b)
        lses.append(lse_b.to(lse_dtype))

    if varlen:
        return torch.cat(outs, dim=0), torch.cat(lses, dim=1)
    return torch.stack(outs), torch.stack(lses)


def _rotate(x, cos, sin, positions, interleaved):
    """Rotary embedding of x (s, h, d) with token t at positions[t]: cos and sin
    (seqlen_ro, rotary_dim / 2); dims past rotary_dim pass through. Interleaved rotates pairs
    (0, 1), (2, 3), ...; otherwise pairs (i, i + rotary_dim / 2)."""
    half = cos.shape[-1]
    rotary_dim = 2 * half
    c = cos[positions].to(x.dtype).unsqueeze(1)  # (s, 1, half)
    s = sin[positions].to(x.dtype).unsqueeze(1)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rotated = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]
        rotated = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rotated, rest], dim=-1)


def kvcache_ref(
    q,
    k_cache,
    v_cache,
    *,
    k=None,
    v=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    block_table=None,
    rotary_cos=None,
    rotary_sin=None,
    rotary_interleaved=True,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    top_left=False,
    sinks=None,
    upcast=True,
):
    """flash_attn_with_kvcache: q (b, s_q, h, d); the cache contiguous (b_cache, s_cache, h_kv, d)
    with sequence b in row cache_batch_idx[b] (b without it), or paged (num_pages, page_size,
    h_kv, d) through block_table (b, max_pages). cache_seqlens (an int or (b)) counts the keys
    cached per sequence, the whole cache when None. k and v (b, s_new, h_kv, d) are appended at
    cache_seqlens[b] first, k rotated (with rotary_cos/sin) at positions cache_seqlens[b] + t;
    q's token i is rotated at cache_seqlens[b] + i with a band (causal or a window), at
    cache_seqlens[b] without, as FlashAttention.

    Returns (out, lse, k_cache_new, v_cache_new): out (b, s_q, h, d_v) and lse (b, h, s_q) as
    attention_ref; the caches are new tensors in the cache's dtype and layout, holding what the
    append must leave there (the inputs are not modified)."""
    if (k is None) != (v is None):
        raise ValueError("append needs both k and v")
    if rotary_cos is not None and k is None:
        raise ValueError("rotary needs k and v to append (as flash_attn_with_kvcache)")
    if k is not None and cache_seqlens is None:
        raise ValueError("append needs cache_seqlens: where the new keys go")
    band = dict(causal=causal, window_size=window_size, softcap=softcap, top_left=top_left)
    options, lse_dtype = _options(q, upcast, softmax_scale, sinks, **band)
    dtype = options["dtype"]
    batch, s_q = q.shape[0], q.shape[1]
    s_new = 0 if k is None else k.shape[1]
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    cached = _as_list(cache_seqlens, batch)
    cached = [capacity if n is None else n for n in cached]
    rows = _as_list(cache_batch_idx, batch)
    banded = causal or window_size[0] >= 0 or window_size[1] >= 0

    k_cache_new, v_cache_new = k_cache.clone(), v_cache.clone()

    def sequence_rows(cache, b):
        """Sequence b's keys as a (capacity, h_kv, d) view into `cache`."""
        if paged:
            return cache[block_table[b].long()].flatten(0, 1)
        return cache[b if rows[b] is None else rows[b]]

    outs, lses = [], []
    for b in range(batch):
        q_b = q[b].to(dtype)
        if k is not None:
            new_positions = torch.arange(cached[b], cached[b] + s_new, device=q.device)
            k_b = k[b]
            if rotary_cos is not None:
                k_b = _rotate(
                    k_b.to(dtype), rotary_cos, rotary_sin, new_positions, rotary_interleaved
                )
                q_positions = torch.full((s_q,), cached[b], device=q.device)
                if banded:
                    q_positions = q_positions + torch.arange(s_q, device=q.device)
                q_b = _rotate(q_b, rotary_cos, rotary_sin, q_positions, rotary_interleaved)
            # Write through the (paged or contiguous) layout: index the pages one token at a time.
            for t, pos in enumerate(new_positions.tolist()):
                if paged:
                    page_size = k_cache.shape[1]
                    page = int(block_table[b, pos // page_size])
                    k_cache_new[page, pos % page_size] = k_b[t].to(k_cache.dtype)
                    v_cache_new[page, pos % page_size] = v[b, t].to(v_cache.dtype)
                else:
                    row = b if rows[b] is None else rows[b]
                    k_cache_new[row, pos] = k_b[t].to(k_cache.dtype)
                    v_cache_new[row, pos] = v[b, t].to(v_cache.dtype)
        seqlen_k = cached[b] + s_new
        out_b, lse_b = _attend(
            q_b,
            sequence_rows(k_cache_new, b)[:seqlen_k],
            sequence_rows(v_cache_new, b)[:seqlen_k],
            slopes=_slopes(alibi_slopes, b),
            bias=None,
            **options,
        )
        outs.append(out_b)
        lses.append(lse_b.to(lse_dtype))
    return torch.stack(outs), torch.stack(lses), k_cache_new, v_cache_new


def max_error(x, ref):
    """Largest |x - ref| in float64, where equal values (-inf LSEs included) differ by 0 and a
    NaN anywhere in x gives NaN."""
    x, ref = x.double(), ref.double()
    diff = torch.where(x == ref, torch.zeros_like(x), (x - ref).abs())
    return diff.max().item() if diff.numel() else 0.0


def check_close(out, out_ref, out_plain, atol=1e-5):
    """FlashAttention's rule: the max abs error of `out` (the kernel's) against `out_ref` (the
    float64 reference) is at most twice that of `out_plain` (the same computation done plainly in
    the input dtype, upcast=False) plus atol. Raises AssertionError with the numbers; returns
    (error, bound)."""
    if out.shape != out_ref.shape or out_plain.shape != out_ref.shape:
        raise AssertionError(
            f"shapes differ: out {tuple(out.shape)}, out_ref {tuple(out_ref.shape)}, "
            f"out_plain {tuple(out_plain.shape)}"
        )
    error = max_error(out, out_ref)
    bound = 2 * max_error(out_plain, out_ref) + atol
    if not error <= bound:  # NaN fails too
        raise AssertionError(
            f"max abs error {error:.3e} exceeds 2 x plain error + atol = {bound:.3e}"
        )
    return error, bound
