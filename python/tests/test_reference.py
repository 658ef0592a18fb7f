# SPDX-License-Identifier: Apache-2.0
"""The float64 reference itself, on the CPU, against hand-computed cases and against itself
reshaped (GQA vs repeated heads, varlen vs dense, paged vs contiguous)."""

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from reference import attention_ref, check_close, kvcache_ref, max_error

f64 = torch.float64


def rand(*shape, dtype=f64, seed=None):
    g = torch.Generator().manual_seed(hash(shape) % 2**31 if seed is None else seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)


def visible_mean(v, visible):
    """With q = 0 every logit is equal, so the output is the mean of v over the visible keys and
    the LSE log(count): v (s_k, d), visible a list per query row of key indices."""
    outs, lses = [], []
    for keys in visible:
        if keys:
            outs.append(v[keys].mean(0))
            lses.append(math.log(len(keys)))
        else:
            outs.append(torch.zeros(v.shape[1], dtype=f64))
            lses.append(float("-inf"))
    return torch.stack(outs), torch.tensor(lses, dtype=f64)


def run_band(s_q, s_k, **options):
    q = torch.zeros(1, s_q, 1, 8, dtype=f64)
    k = rand(1, s_k, 1, 8)
    v = rand(1, s_k, 1, 8, seed=1)
    out, lse = attention_ref(q, k, v, **options)
    return out[0, :, 0], lse[0, 0], v[0, :, 0]


@pytest.mark.parametrize(
    "s_q,s_k,options,visible",
    [
        # Bottom-right causal with more queries than keys: the first rows see nothing.
        (3, 1, dict(causal=True), [[], [], [0]]),
        (2, 4, dict(causal=True), [[0, 1, 2], [0, 1, 2, 3]]),
        (2, 4, dict(causal=True, top_left=True), [[0], [0, 1]]),
        # A window of one key to the left, none to the right.
        (4, 4, dict(window_size=(1, 0)), [[0], [0, 1], [1, 2], [2, 3]]),
        # Unbounded left, one to the right.
        (4, 4, dict(window_size=(-1, 1)), [[0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3]]),
        # causal forces right = 0 and keeps left (Hugging Face's (w - 1, w - 1) with causal).
        (4, 4, dict(causal=True, window_size=(1, 1)), [[0], [0, 1], [1, 2], [2, 3]]),
        (2, 5, dict(window_size=(0, 0)), [[3], [4]]),
        (2, 5, dict(window_size=(0, 0), top_left=True), [[0], [1]]),
    ],
)
def test_band_by_hand(s_q, s_k, options, visible):
    out, lse, v = run_band(s_q, s_k, **options)
    out_hand, lse_hand = visible_mean(v, visible)
    torch.testing.assert_close(out, out_hand)
    torch.testing.assert_close(lse, lse_hand)


def test_two_keys_by_hand():
    # d = 4, scale 1/2: scores 0 and ln 2, so probabilities 1/3 and 2/3, LSE ln 3.
    q = torch.tensor([[[[1.0, 0, 0, 0]]]], dtype=f64)
    k = torch.tensor([[[[0.0, 0, 0, 0]], [[2 * math.log(2), 0, 0, 0]]]], dtype=f64)
    v = torch.tensor([[3.0, 0, 0, 6], [0.0, 3, 0, 0]], dtype=f64).view(1, 2, 1, 4)
    out, lse = attention_ref(q, k, v)
    torch.testing.assert_close(out[0, 0, 0], torch.tensor([1.0, 2, 0, 2], dtype=f64))
    torch.testing.assert_close(lse[0, 0, 0].item(), math.log(3))
    # An explicit scale replaces 1/sqrt(d): scale 1/(2 ln 2) makes the scores 0 and 1.
    out, lse = attention_ref(q, k, v, softmax_scale=1 / (2 * math.log(2)))
    p = torch.softmax(torch.tensor([0.0, 1.0], dtype=f64), 0)
    torch.testing.assert_close(out[0, 0, 0], p[0] * v[0, 0, 0] + p[1] * v[0, 1, 0])
    torch.testing.assert_close(lse[0, 0, 0].item(), math.log(1 + math.e))


def test_softcap_by_hand():
    q = torch.tensor([5.0], dtype=f64).view(1, 1, 1, 1)
    k = torch.tensor([1.0, 0.0], dtype=f64).view(1, 2, 1, 1)
    v = torch.tensor([1.0, 0.0], dtype=f64).view(1, 2, 1, 1)
    out, lse = attention_ref(q, k, v, softcap=2.0)
    logit = 2.0 * math.tanh(5.0 / 2.0)  # scaled score 5 (d = 1), capped
    torch.testing.assert_close(out.item(), math.exp(logit) / (math.exp(logit) + 1))
    torch.testing.assert_close(lse.item(), math.log(math.exp(logit) + 1))


@pytest.mark.parametrize("top_left", [False, True])
def test_alibi_by_hand(top_left):
    # One query, three keys, q = 0: logits are -slope * |0 + offset - j|.
    slope = 0.7
    q = torch.zeros(1, 1, 2, 4, dtype=f64)
    k = rand(1, 3, 1, 4)
    v = rand(1, 3, 1, 4, seed=2)
    slopes = torch.tensor([slope, 0.0], dtype=torch.float32)
    out, lse = attention_ref(q, k, v, alibi_slopes=slopes, top_left=top_left)
    offset = 0 if top_left else 2
    logits = torch.tensor([-slope * abs(offset - j) for j in range(3)], dtype=f64)
    p = torch.softmax(logits, 0)
    torch.testing.assert_close(out[0, 0, 0], p @ v[0, :, 0])
    torch.testing.assert_close(lse[0, 0, 0], torch.logsumexp(logits, 0))
    torch.testing.assert_close(out[0, 0, 1], v[0, :, 0].mean(0))  # slope 0: plain mean
    # (batch, heads) slopes pick per batch.
    out2, _ = attention_ref(q, k, v, alibi_slopes=slopes.view(1, 2), top_left=top_left)
    torch.testing.assert_close(out2, out)


def test_bias_broadcast_and_fully_masked_row():
    q, k, v = rand(2, 3, 2, 8), rand(2, 5, 2, 8), rand(2, 5, 2, 8, seed=3)
    bias = rand(1, 1, 3, 5, seed=4).clone()
    bias[0, 0, 1] = float("-inf")  # row 1 masked in every batch and head
    out, lse = attention_ref(q, k, v, bias=bias.expand(2, 2, 3, 5))
    scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(8) + bias
    probs = torch.softmax(scores, -1).nan_to_num(0.0)
    torch.testing.assert_close(out, torch.einsum("bhij,bjhd->bihd", probs, v))
    assert torch.isneginf(lse[:, :, 1]).all()
    assert (out[:, 1] == 0).all()
    torch.testing.assert_close(lse[:, :, [0, 2]], torch.logsumexp(scores, -1)[:, :, [0, 2]])


def test_sinks_rescale_the_output_and_join_the_lse():
    """A sink adds exp(sink) to each row's denominator: out scales by exp(lse - lse_sink) and
    lse_sink = logaddexp(lse, sink); a row with no key gets out 0 and lse = sink; -inf is none."""
    q, k, v = rand(2, 6, 3, 8), rand(2, 4, 3, 8, seed=2), rand(2, 4, 3, 8, seed=3)
    sinks = torch.tensor([0.5, 3.0, float("-inf")], dtype=torch.float32)
    kw = dict(causal=True, window_size=(1, 0))  # queries 0 and 1 see no key
    out, lse = attention_ref(q, k, v, **kw)
    out_s, lse_s = attention_ref(q, k, v, sinks=sinks, **kw)
    want_lse = torch.logaddexp(lse, sinks.to(f64).view(1, 3, 1).expand_as(lse))
    torch.testing.assert_close(lse_s, want_lse, rtol=0, atol=1e-12)
    scale = torch.exp(lse - lse_s).nan_to_num(0.0).transpose(1, 2).unsqueeze(-1)
    torch.testing.assert_close(out_s, out * scale, rtol=0, atol=1e-12)
    assert (out_s[:, :2] == 0).all()
    assert lse_s[0, 1, 0] == 3.0
    assert torch.isneginf(lse_s[:, 2, :2]).all()


def test_gqa_equals_repeated_heads():
    q, k, v = rand(2, 5, 6, 16), rand(2, 7, 2, 16), rand(2, 7, 2, 16, seed=5)
    slopes = torch.rand(2, 6)
    options = dict(causal=True, window_size=(3, -1), softcap=5.0, alibi_slopes=slopes)
    out, lse = attention_ref(q, k, v, **options)
    # Head h reads kv head h // 3.
    k_rep, v_rep = k.repeat_interleave(3, dim=2), v.repeat_interleave(3, dim=2)
    out_rep, lse_rep = attention_ref(q, k_rep, v_rep, **options)
    torch.testing.assert_close(out, out_rep)
    torch.testing.assert_close(lse, lse_rep)
    # MQA.
    out_mqa, _ = attention_ref(q, k[:, :, :1], v[:, :, :1])
    out_rep, _ = attention_ref(q, k[:, :, :1].expand(2, 7, 6, 16), v[:, :, :1].expand(2, 7, 6, 16))
    torch.testing.assert_close(out_mqa, out_rep)


def test_head_dim_v_differs():
    q, k, v = rand(1, 3, 2, 16), rand(1, 4, 2, 16), rand(1, 4, 2, 8)
    out, _ = attention_ref(q, k, v)
    assert out.shape == (1, 3, 2, 8)


@pytest.mark.parametrize(
    "options", [dict(), dict(causal=True), dict(window_size=(2, 1), softcap=3.0)]
)
def test_varlen_equals_per_sequence_dense(options):
    lens_q, lens_k = [3, 1, 4], [5, 2, 4]
    cu_q = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 7, 11], dtype=torch.int32)
    q, k, v = rand(8, 4, 8), rand(11, 2, 8), rand(11, 2, 8, seed=6)
    slopes = torch.rand(3, 4)
    out, lse = attention_ref(
        q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, alibi_slopes=slopes, **options
    )
    assert out.shape == (8, 4, 8) and lse.shape == (4, 8)
    for b in range(3):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        out_b, lse_b = attention_ref(
            q[sq][None], k[sk][None], v[sk][None], alibi_slopes=slopes[b], **options
        )
        assert out_b.shape[1] == lens_q[b] and k[sk].shape[0] == lens_k[b]
        torch.testing.assert_close(out[sq], out_b[0])
        torch.testing.assert_close(lse[:, sq], lse_b[0])


def test_seqused_k_equals_truncated_keys():
    q, k, v = rand(2, 3, 2, 8), rand(2, 6, 2, 8), rand(2, 6, 2, 8, seed=7)
    used = torch.tensor([4, 0], dtype=torch.int32)
    out, lse = attention_ref(q, k, v, causal=True, seqused_k=used)
    out0, lse0 = attention_ref(q[:1], k[:1, :4], v[:1, :4], causal=True)
    torch.testing.assert_close(out[:1], out0)
    torch.testing.assert_close(lse[:1], lse0)
    assert (out[1] == 0).all() and torch.isneginf(lse[1]).all()  # no keys at all


def test_upcast_false_computes_in_input_dtype():
    q, k, v = (rand(1, 4, 2, 16, dtype=torch.bfloat16, seed=s) for s in (8, 9, 10))
    out, lse = attention_ref(q, k, v, causal=True)
    out_plain, lse_plain = attention_ref(q, k, v, causal=True, upcast=False)
    assert out.dtype == f64 and lse.dtype == f64
    assert out_plain.dtype == torch.bfloat16 and lse_plain.dtype == torch.float32
    assert 0 < max_error(out_plain, out) < 0.05


def test_check_close_rule():
    ref = torch.tensor([1.0, 2.0, float("-inf")], dtype=f64)
    plain = torch.tensor([1.01, 2.0, float("-inf")])
    assert check_close(torch.tensor([1.0, 2.02, float("-inf")]), ref, plain)[0] == pytest.approx(
        0.02
    )
    with pytest.raises(AssertionError, match="exceeds"):
        check_close(torch.tensor([1.0, 2.03, float("-inf")]), ref, plain)
    with pytest.raises(AssertionError):
        check_close(torch.tensor([1.0, float("nan"), float("-inf")]), ref, plain)
    with pytest.raises(AssertionError):
        check_close(torch.tensor([1.0, 2.0, 0.0]), ref, plain)  # 0 where -inf
    with pytest.raises(AssertionError, match="shapes"):
        check_close(ref[:2], ref, plain)


def make_cache(batch, capacity, page_size, heads_kv, d, seed):
    """A paged cache with pages in shuffled order and its contiguous equivalent."""
    pages_per_seq = capacity // page_size
    num_pages = batch * pages_per_seq + 3
    k_paged = rand(num_pages, page_size, heads_kv, d, dtype=torch.bfloat16, seed=seed)
    v_paged = rand(num_pages, page_size, heads_kv, d, dtype=torch.bfloat16, seed=seed + 1)
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    block_table = perm[: batch * pages_per_seq].view(batch, pages_per_seq).to(torch.int32)
    k_cont = k_paged[block_table.long()].flatten(1, 2).clone()
    v_cont = v_paged[block_table.long()].flatten(1, 2).clone()
    return k_paged, v_paged, block_table, k_cont, v_cont


@pytest.mark.parametrize("band", [None, "causal", "window"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_kvcache_paged_equals_contiguous_and_dense(band, interleaved):
    batch, capacity, page_size, heads, heads_kv, d = 2, 12, 4, 4, 2, 16
    k_paged, v_paged, table, k_cont, v_cont = make_cache(
        batch, capacity, page_size, heads_kv, d, 11
    )
    q = rand(batch, 2, heads, d, dtype=torch.bfloat16, seed=20)
    k_new = rand(batch, 2, heads_kv, d, dtype=torch.bfloat16, seed=21)
    v_new = rand(batch, 2, heads_kv, d, dtype=torch.bfloat16, seed=22)
    seqlens = torch.tensor([5, 9], dtype=torch.int32)
    angle = torch.rand(capacity, 4, generator=torch.Generator().manual_seed(23)) * 2 * math.pi
    cos, sin = angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)
    band_options = dict(
        causal=band == "causal", window_size=(6, -1) if band == "window" else (-1, -1)
    )
    options = dict(
        k=k_new,
        v=v_new,
        cache_seqlens=seqlens,
        rotary_cos=cos,
        rotary_sin=sin,
        rotary_interleaved=interleaved,
        **band_options,
    )
    k_paged_before = k_paged.clone()
    out_p, lse_p, kc_p, vc_p = kvcache_ref(q, k_paged, v_paged, block_table=table, **options)
    out_c, lse_c, kc_c, vc_c = kvcache_ref(q, k_cont, v_cont, **options)
    assert torch.equal(k_paged, k_paged_before)  # inputs untouched
    torch.testing.assert_close(out_p, out_c, rtol=0, atol=0)
    torch.testing.assert_close(lse_p, lse_c, rtol=0, atol=0)
    torch.testing.assert_close(kc_p[table.long()].flatten(1, 2), kc_c, rtol=0, atol=0)
    torch.testing.assert_close(vc_p[table.long()].flatten(1, 2), vc_c, rtol=0, atol=0)

    # The append: v lands verbatim at seqlens[b]..; k rotated there; the rest unchanged.
    for b in range(batch):
        n = int(seqlens[b])
        assert torch.equal(vc_c[b, n : n + 2], v_new[b])
        assert torch.equal(kc_c[b, :n], k_cont[b, :n]) and torch.equal(
            kc_c[b, n + 2 :], k_cont[b, n + 2 :]
        )
        assert not torch.equal(kc_c[b, n : n + 2], k_new[b])
    # Dense attention over the appended cache with q rotated by hand agrees.
    for b in range(batch):
        n = int(seqlens[b])
        q_pos = [n, n + 1] if band else [n, n]  # FlashAttention: with a band, per token
        q_rot = rotate_by_hand(q[b].double(), cos, sin, q_pos, interleaved)
        out_d, lse_d = attention_ref(
            q_rot[None], kc_c[b : b + 1, : n + 2], vc_c[b : b + 1, : n + 2], **band_options
        )
        torch.testing.assert_close(out_c[b : b + 1], out_d)
        torch.testing.assert_close(lse_c[b : b + 1], lse_d)


def rotate_by_hand(x, cos, sin, positions, interleaved):
    """x (s, h, d) rotated pair by pair with explicit loops."""
    x = x.clone()
    half = cos.shape[1]
    out = x.clone()
    for t, pos in enumerate(positions):
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            c, s = float(cos[pos, i]), float(sin[pos, i])
            out[t, :, a] = x[t, :, a] * c - x[t, :, b] * s
            out[t, :, b] = x[t, :, a] * s + x[t, :, b] * c
    return out


def test_kvcache_batch_idx_and_no_append():
    q = rand(2, 1, 2, 8)
    k_cache, v_cache = rand(3, 6, 2, 8, seed=30), rand(3, 6, 2, 8, seed=31)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    seqlens = torch.tensor([4, 6], dtype=torch.int32)
    out, lse, kc, vc = kvcache_ref(
        q, k_cache, v_cache, cache_seqlens=seqlens, cache_batch_idx=idx, softcap=4.0
    )
    assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache)
    for b, (row, n) in enumerate([(2, 4), (0, 6)]):
        out_d, lse_d = attention_ref(
            q[b : b + 1], k_cache[row : row + 1, :n], v_cache[row : row + 1, :n], softcap=4.0
        )
        torch.testing.assert_close(out[b : b + 1], out_d)
        torch.testing.assert_close(lse[b : b + 1], lse_d)
    # No cache_seqlens: the whole cache; an int: every sequence.
    out_all, _, _, _ = kvcache_ref(q, k_cache[:2], v_cache[:2])
    out_int, _, _, _ = kvcache_ref(q, k_cache[:2], v_cache[:2], cache_seqlens=6)
    torch.testing.assert_close(out_all, attention_ref(q, k_cache[:2], v_cache[:2])[0])
    torch.testing.assert_close(out_int, out_all)


def test_kvcache_empty_sequence_and_errors():
    q = rand(1, 1, 1, 8)
    k_cache, v_cache = rand(1, 4, 1, 8), rand(1, 4, 1, 8, seed=40)
    out, lse, _, _ = kvcache_ref(
        q, k_cache, v_cache, cache_seqlens=torch.tensor([0], dtype=torch.int32)
    )
    assert (out == 0).all() and torch.isneginf(lse).all()
    with pytest.raises(ValueError, match="cache_seqlens"):
        kvcache_ref(q, k_cache, v_cache, k=k_cache[:, :1], v=v_cache[:, :1])
    with pytest.raises(ValueError, match="rotary"):
        kvcache_ref(q, k_cache, v_cache, rotary_cos=torch.ones(4, 2), rotary_sin=torch.zeros(4, 2))
