# SPDX-License-Identifier: Apache-2.0
"""FlashAttention's calls (flash_attn 2.x's flash_attn_interface: names, argument order and
defaults) over kiln's ops, plus kiln's own: merge_states, warmup, info.

kiln's extras are keyword-only: an additive `bias` (any strides), `top_left` band alignment,
`return_softmax_lse` (where FlashAttention has it only for the KV cache), and `out=`. An argument
of FlashAttention's that kiln cannot honour (dropout, attention probabilities, a paged varlen
call, cache_leftpad) raises a KilnError naming it; none is ignored.

flash_attn_func, flash_attn_varlen_func and their packed forms are differentiable in q, k, v,
sinks and bias: with an input that requires grad (and grad mode on) they call kiln's functional
op, whose autograd formula is kiln's backward; what that backward cannot differentiate (ALiBi
slopes or a variant tensor that requires grad, out=) is refused then, naming it. A variant's
logit hook needs its derivative (logit_grad, or logit_is_additive: kiln/variant.hpp), or the
backward's kernels fail to compile, saying so.
"""
import os

import torch

from . import _capi, _checks, _progress, ops
from ._capi import KILN_ERROR_NOT_FOUND, KILN_ERROR_UNSUPPORTED, KilnError
from ._checks import flag, integer, number, tensor, with_rank
from .variant import Variant


def _unsupported(argument, value, instead):
    raise _capi.KilnValueError(KILN_ERROR_UNSUPPORTED,
                               f"{argument}={value!r} is not supported by kiln: {instead}")


_invalid = _checks.invalid

_UNBOUNDED = (-1, -1)
_LAYOUT = "(batch, seqlen, heads, head_dim)"
_VARLEN_LAYOUT = "(total_tokens, heads, head_dim), sequences at cu_seqlens"


def _scale(softmax_scale):
    """kiln's softmax_scale argument: 0 means FlashAttention's default, 1 / sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    scale = number("softmax_scale", softmax_scale, ", or None for 1 / sqrt(head_dim)")
    if not scale > 0:
        _invalid(f"softmax_scale={softmax_scale!r}: pass a positive scale, or None for "
                 f"1 / sqrt(head_dim)")
    return scale


def _window(window_size):
    """(window_left, window_right) from FlashAttention's window_size: -1 is unbounded."""
    if window_size == _UNBOUNDED:  # the default, first: every call pays for this check
        return _UNBOUNDED
    fix = "pass (left, right), each a key count (a C int) >= 0 or -1 for unbounded"
    if not isinstance(window_size, (tuple, list)) or not all(
            isinstance(side, int) and not isinstance(side, bool) for side in window_size):
        raise _capi.KilnTypeError(_capi.KILN_ERROR_INVALID_ARGUMENT,
                                  f"window_size={window_size!r}: {fix}")
    if len(window_size) != 2 or not all(-1 <= side <= _checks.INT_MAX for side in window_size):
        _invalid(f"window_size={window_size!r}: {fix}")
    return tuple(window_size)


def _seqlen(name, value):
    # A tensor here would need .item(), a host sync that torch.compile and CUDA graphs refuse.
    if isinstance(value, (bool, torch.Tensor)):
        _checks.wrong_type(name, value, "a Python int, as FlashAttention takes it (the longest "
                                        "sequence in the batch)")
    return integer(name, value, 0, meaning=", the longest sequence in the batch")


def _forward_only(dropout_p, return_attn_probs):
    if number("dropout_p", dropout_p) != 0.0:
        _unsupported("dropout_p", dropout_p, "kiln has no dropout; pass dropout_p=0.0 (as "
                     "FlashAttention asks for evaluation)")
    if flag("return_attn_probs", return_attn_probs):
        _unsupported("return_attn_probs", return_attn_probs,
                     "kiln never forms the attention probabilities; for the softmax LSE pass "
                     "return_softmax_lse=True, which returns (out, softmax_lse)")


def _score(softmax_scale, causal, window_size, softcap, top_left):
    """The score's options, as the ops take them: scale, causal, left, right, top_left,
    softcap."""
    left, right = _window(window_size)
    return (_scale(softmax_scale), flag("causal", causal), left, right,
            flag("top_left", top_left), number("softcap", softcap))


def _stride1(t):
    """t with a unit stride on its last dim, as kiln needs (and FlashAttention makes); one of
    rank 0, which kiln refuses, as it is."""
    return t if t is None or t.dim() == 0 or t.stride(-1) == 1 else t.contiguous()


def _output(out, shape, like, name, dtypes=None):
    """`out` checked against the shape and dtype the call writes (one of `dtypes`; None: like's),
    or a new tensor (of the first of `dtypes`)."""
    dtypes = dtypes or (like.dtype,)
    if out is None:
        return like.new_empty(shape, dtype=dtypes[0])
    tensor(name, out)
    if tuple(out.shape) != tuple(shape) or out.dtype not in dtypes:
        written = " or ".join(str(d) for d in dtypes)
        _invalid(f"{name} has shape {tuple(out.shape)} and dtype {out.dtype}: this call writes "
                 f"{tuple(shape)} {written}")
    return out


def _forward_output(out, shape, q):
    """The forward's out: q's dtype, or with an fp8 q (the all-fp8 forward) bf16, as
    FlashAttention-3's, or fp16 given as out=."""
    if q.dtype in _checks.FP8_DTYPES:
        return _output(out, shape, q, "out", (torch.bfloat16, torch.float16))
    return _output(out, shape, q, "out")


def _optional(**tensors):
    """The optional tensor arguments `tensors`, each None or a torch.Tensor, in order."""
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            tensor(name, t)
    return tensors.values()


def _run(op, first, *args):
    """One op call: straight to its implementation when eager (kiln.ops says why)."""
    if ops.eager(first):
        ops.direct[op](*args)
    else:
        op(*args)


_NO_VARIANT = (None, None, [], [])


def _variant(variant, scalars, tensors):
    """The ops' variant arguments (name, code, scalars, tensors) from the calls' keywords."""
    if variant is None and scalars == () and tensors == ():  # the defaults, first
        return _NO_VARIANT
    if not isinstance(scalars, (list, tuple)):
        _checks.wrong_type("variant_scalars", scalars, "a list or tuple of up to 8 numbers")
    tensors = _checks.tensor_list("variant_tensors", tensors)
    if variant is None:
        if scalars or tensors:
            _invalid("variant_scalars or variant_tensors without a variant: pass variant="
                     "kiln.Variant(name, code), or neither")
        return _NO_VARIANT
    if not isinstance(variant, Variant):
        _checks.wrong_type("variant", variant, "a kiln.Variant(name, code)")
    scalars = [number(f"variant_scalars[{i}]", x) for i, x in enumerate(scalars)]
    return variant.name, variant.code, scalars, tensors


def _result(out, lse, what, inputs):
    """A call's result; the output of a call without a backward raises on a backward through
    it."""
    if torch.is_grad_enabled() and ops.needs_grad(inputs):
        out = ops.NoBackward.apply(out, what, *inputs)
    return out if lse is None else (out, lse)


def _trains(*inputs):
    """Whether a differentiable call on `inputs` (None entries skipped) must record its
    backward."""
    return torch.is_grad_enabled() and ops.needs_grad(inputs)


def _not_differentiable(argument, why):
    raise _capi.KilnNotImplementedError(
        KILN_ERROR_UNSUPPORTED, f"{argument} requires grad: {why}; pass it detached "
        f"({argument}.detach()), or run the call under torch.no_grad()")


def _no_q_descale(q_descale):
    """FlashAttention-3's q_descale, an fp8 q's, refused in decode: kiln's decode reads fp8 caches
    under 16-bit queries."""
    if q_descale is not None:
        _unsupported("q_descale", "<tensor>", "pass q in bf16 or fp16: kiln's decode reads fp8 "
                     "caches under 16-bit queries (flash_attn_func takes an fp8 q)")


def _forward_only_fp8(q, k, k_descale, v_descale, q_descale):
    """A call that must record its backward, refused when it reads fp8 k and v: kiln's backward
    takes k and v in q's dtype. Descales without fp8 k (or q) are refused as libkiln refuses
    them."""
    _checks.descales(k, k_descale, v_descale)
    _checks.q_descale_of(q, q_descale)
    if k.dtype in _checks.FP8_DTYPES:
        raise _capi.KilnNotImplementedError(
            KILN_ERROR_UNSUPPORTED, f"k of dtype {_checks.DTYPE_NAMES[k.dtype]} in a call whose "
            "inputs require grad: kiln's backward takes k and v in q's dtype, not fp8; run the "
            "call under torch.no_grad(), or pass the inputs detached")


def _differentiable(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
                    max_seqlen_q, max_seqlen_k, score, sinks, hooks, deterministic, out,
                    return_softmax_lse):
    """The call through kiln's differentiable op (kiln.ops.attention_with_grad), for inputs that
    require grad: what kiln's backward cannot differentiate is refused here, at the forward,
    never answered with a missing or zero gradient."""
    if alibi_slopes is not None and alibi_slopes.requires_grad:
        _not_differentiable("alibi_slopes", "kiln, as FlashAttention, computes no gradient for "
                            "the ALiBi slopes")
    for i, t in enumerate(hooks[3]):
        if t.requires_grad:
            _not_differentiable(f"variant_tensors[{i}]", "kiln computes no gradient for a "
                                "variant's tensors yet")
    if out is not None:
        training = ", ".join(name for name, t in (("q", q), ("k", k), ("v", v), ("sinks", sinks),
                                                  ("bias", bias))
                             if t is not None and t.requires_grad)
        _invalid(f"out= with inputs that require grad ({training}): autograd cannot "
                 f"differentiate a call that writes into a tensor given to it; leave out=None, "
                 f"or run the call under torch.no_grad()")
    out, lse = ops.attention_with_grad(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                                       seqused_k, max_seqlen_q, max_seqlen_k, *score, sinks,
                                       *hooks, flag("deterministic", deterministic))
    return (out, lse) if return_softmax_lse else out


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, bias=None, top_left=False,
                    return_softmax_lse=False, out=None, sinks=None, variant=None,
                    variant_scalars=(), variant_tensors=(), q_descale=None, k_descale=None,
                    v_descale=None):
    """Attention over q (batch, seqlen_q, heads, d), k and v (batch, seqlen_k, heads_kv, d / dv):
    out (batch, seqlen_q, heads, dv), as FlashAttention's flash_attn_func, with the same
    defaults (softmax_scale None: 1 / sqrt(d); causal aligned bottom-right; window_size
    (-1, -1): unbounded; softcap 0: off). GQA/MQA when heads_kv divides heads.

    kiln's keyword-only extras: bias, added to the scores, (batch, heads, seqlen_q, seqlen_k)
    in q's dtype with any strides (0 broadcasts); top_left=True aligns the causal/window band
    top-left; return_softmax_lse=True returns (out, softmax_lse), softmax_lse float32
    (batch, heads, seqlen_q); out= writes the output there; sinks, float32 (heads): a learned
    logit per head that joins each row's softmax denominator with no value (gpt-oss), counted
    in softmax_lse; variant, a kiln.Variant (attention hooks written as device code, compiled
    into the kernels), with its variant_scalars (up to 8 numbers) and variant_tensors (up to 4,
    any dtype and strides), which change without a recompile. The forward is deterministic.

    fp8 k and v (torch.float8_e4m3fn or float8_e5m2) under a bf16 or fp16 q, on sm_89 and newer,
    head dims multiples of 16: each value is widened to q's dtype exactly (under a bf16 q over
    e4m3 on sm_90a, K stays e4m3 and q is split into two e4m3 terms, exact to 2^-9 of a tile's
    largest magnitude, for fp8 products: see the README); k_descale and
    v_descale (FlashAttention-3's), float32 (batch, heads_kv) or None (1), multiply them in fp32
    (k's the scores, v's the output). q, k and v all float8_e4m3fn (the all-fp8 forward, sm_90a;
    no bias): fp8 products, out bf16 (fp16 through out=), and q_descale
    like k_descale. No backward: with an input that requires grad they are refused.

    Differentiable in q, k, v, sinks (dsinks) and bias (dbias, summed where it has size 1 and
    broadcasts), as FlashAttention's and PyTorch's: deterministic=True makes the backward's
    gradients bitwise reproducible. softmax_lse gets no gradient (as FlashAttention's), nor do a
    variant's tensors. With an input that requires grad, out= and ALiBi slopes or a variant
    tensor that requires grad are refused.
    """
    _forward_only(dropout_p, return_attn_probs)
    score = _score(softmax_scale, causal, window_size, softcap, top_left)
    q = _stride1(with_rank("q", q, 4, _LAYOUT))
    k = _stride1(with_rank("k", k, 4, _LAYOUT))
    v = _stride1(with_rank("v", v, 4, _LAYOUT))
    return_softmax_lse = flag("return_softmax_lse", return_softmax_lse)
    hooks = _variant(variant, variant_scalars, variant_tensors)
    bias, alibi_slopes, sinks, k_descale, v_descale, q_descale = _optional(
        bias=bias, alibi_slopes=alibi_slopes, sinks=sinks, k_descale=k_descale,
        v_descale=v_descale, q_descale=q_descale)
    if _trains(q, k, v, sinks, bias, alibi_slopes, k_descale, v_descale, q_descale, *hooks[3]):
        _forward_only_fp8(q, k, k_descale, v_descale, q_descale)
        return _differentiable(q, k, v, bias, alibi_slopes, None, None, None, 0, 0, score,
                               sinks, hooks, deterministic, out, return_softmax_lse)
    batch, seqlen_q, heads = q.shape[:3]
    out = _forward_output(out, (batch, seqlen_q, heads, v.shape[-1]), q)
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32) \
        if return_softmax_lse else None
    _run(ops.attention, q, q, k, v, out, lse, bias, alibi_slopes, None, None, None, 0, 0,
         *score, sinks, k_descale, v_descale, q_descale, *hooks)
    return out if lse is None else (out, lse)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, seqused_k=None,
                           bias=None, top_left=False, return_softmax_lse=False, out=None,
                           sinks=None, variant=None, variant_scalars=(), variant_tensors=(),
                           q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_func over packed sequences, as FlashAttention's flash_attn_varlen_func: q
    (total_q, heads, d), k and v (total_k, heads_kv, d / dv), sequence b at
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] (int32, batch + 1); max_seqlen_q/k are Python ints.
    out (total_q, heads, dv); softmax_lse float32 (heads, total_q).

    kiln's keyword-only extras: those of flash_attn_func (fp8 k and v with descales
    (batch, heads_kv), a row per sequence, among them), and seqused_k (int32, batch): the keys
    each sequence uses, from its start (FlashAttention 3's); a variant's key index counts from
    its sequence's start. block_table (a paged varlen call)
    is not supported: use flash_attn_with_kvcache for a paged cache.

    Differentiable as flash_attn_func.
    """
    _forward_only(dropout_p, return_attn_probs)
    if block_table is not None:
        _unsupported("block_table", "<tensor>", "kiln's varlen attention reads contiguous k and "
                     "v; for a paged cache call flash_attn_with_kvcache")
    score = _score(softmax_scale, causal, window_size, softcap, top_left)
    q = _stride1(with_rank("q", q, 3, _VARLEN_LAYOUT))
    k = _stride1(with_rank("k", k, 3, _VARLEN_LAYOUT))
    v = _stride1(with_rank("v", v, 3, _VARLEN_LAYOUT))
    return_softmax_lse = flag("return_softmax_lse", return_softmax_lse)
    hooks = _variant(variant, variant_scalars, variant_tensors)
    bias, alibi_slopes, sinks, seqused_k, k_descale, v_descale, q_descale = _optional(
        bias=bias, alibi_slopes=alibi_slopes, sinks=sinks, seqused_k=seqused_k,
        k_descale=k_descale, v_descale=v_descale, q_descale=q_descale)
    sequences = (tensor("cu_seqlens_q", cu_seqlens_q), tensor("cu_seqlens_k", cu_seqlens_k),
                 seqused_k, _seqlen("max_seqlen_q", max_seqlen_q),
                 _seqlen("max_seqlen_k", max_seqlen_k))
    if _trains(q, k, v, sinks, bias, alibi_slopes, k_descale, v_descale, q_descale, *hooks[3]):
        _forward_only_fp8(q, k, k_descale, v_descale, q_descale)
        return _differentiable(q, k, v, bias, alibi_slopes, *sequences, score, sinks, hooks,
                               deterministic, out, return_softmax_lse)
    total_q, heads = q.shape[:2]
    out = _forward_output(out, (total_q, heads, v.shape[-1]), q)
    lse = q.new_empty((heads, total_q), dtype=torch.float32) if return_softmax_lse else None
    _run(ops.attention, q, q, k, v, out, lse, bias, alibi_slopes, *sequences, *score, sinks,
         k_descale, v_descale, q_descale, *hooks)
    return out if lse is None else (out, lse)


def _unpacked(name, packed, rank, count, layout):
    """The `count` tensors packed along dim -3 of `packed` (q, k and v, or k and v), as views;
    their gradients flow back into `packed`'s."""
    with_rank(name, packed, rank, layout)
    if packed.shape[-3] != count:
        _invalid(f"{name} has shape {tuple(packed.shape)}: its dim {rank - 3} must be {count}, "
                 f"{layout}")
    return packed.unbind(-3)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, **kiln_extras):
    """flash_attn_func with q, k and v packed in qkv (batch, seqlen, 3, heads, d), as
    FlashAttention's flash_attn_qkvpacked_func; its gradient is qkv's. kiln_extras: the
    keyword-only extras of flash_attn_func (bias=, sinks=, return_softmax_lse=, ...)."""
    q, k, v = _unpacked("qkv", qkv, 5, 3, "(batch, seqlen, 3, heads, head_dim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, **kiln_extras)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, **kiln_extras):
    """flash_attn_func with k and v packed in kv (batch, seqlen_k, 2, heads_kv, d), as
    FlashAttention's flash_attn_kvpacked_func; kiln_extras as flash_attn_qkvpacked_func's."""
    k, v = _unpacked("kv", kv, 5, 2, "(batch, seqlen_k, 2, heads_kv, head_dim)")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, **kiln_extras)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, **kiln_extras):
    """flash_attn_varlen_func with q, k and v packed in qkv (total, 3, heads, d), sharing
    cu_seqlens and max_seqlen, as FlashAttention's flash_attn_varlen_qkvpacked_func;
    kiln_extras: the keyword-only extras of flash_attn_varlen_func."""
    q, k, v = _unpacked("qkv", qkv, 4, 3, "(total_tokens, 3, heads, head_dim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs, **kiln_extras)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, **kiln_extras):
    """flash_attn_varlen_func with k and v packed in kv (total_k, 2, heads_kv, d), as
    FlashAttention's flash_attn_varlen_kvpacked_func; kiln_extras as
    flash_attn_varlen_qkvpacked_func's."""
    k, v = _unpacked("kv", kv, 4, 2, "(total_tokens, 2, heads_kv, head_dim)")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  **kiln_extras)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, top_left=False, out=None, sinks=None,
                            variant=None, variant_scalars=(), variant_tensors=(), q_descale=None,
                            k_descale=None, v_descale=None, k_token_descale=None,
                            v_token_descale=None):
    """Decode over a KV cache, as FlashAttention's flash_attn_with_kvcache: q (batch, seqlen_q,
    heads, d); the cache contiguous (batch_cache, seqlen_cache, heads_kv, d / dv), rows picked by
    cache_batch_idx (int32, batch), or paged (num_pages, page_size, heads_kv, d / dv) with
    block_table (int32, batch, max_pages), any page size. cache_seqlens: an int or int32
    (batch,), the keys cached per sequence before this call; None: the whole contiguous cache.
    k and v (batch, seqlen_new, heads_kv, d / dv) are written into the cache at cache_seqlens
    first (in place; the caller advances cache_seqlens), rotated by rotary_cos/rotary_sin
    (seqlen_ro, rotary_dim / 2) when given, as is q, at FlashAttention's positions, on
    interleaved pairs by default. num_splits 0: kiln's heuristic. Returns out (batch, seqlen_q,
    heads, dv), or (out, softmax_lse) with softmax_lse float32 (batch, heads, seqlen_q).

    kiln's keyword-only extras: top_left=True aligns the band top-left; out= writes the output
    there; sinks as flash_attn_func's, counted once per row whatever the split; variant as
    flash_attn_func's, its key index counting from the cache's start. cache_leftpad is not
    supported.

    An fp8 cache (torch.float8_e4m3fn or float8_e5m2, on sm_89 and newer) is read under bf16 or
    fp16 q, converted exactly; k_descale and v_descale, float32 (batch, heads_kv) as
    FlashAttention-3's, are what its stored keys and values are multiplied by (None: 1). q stays
    bf16 or fp16: q_descale is refused. k and v appended into an fp8 cache are q's dtype: they are
    divided by the descales and rounded to the cache's dtype, saturating at its largest finite
    value (rotary first, its result rounded to q's dtype). k_token_descale and v_token_descale,
    float32 shaped as the cache less its head dim ((batch_cache, seqlen_cache, heads_kv), or
    (num_pages, page_size, heads_kv)), any strides (with k and v, which write them, an element
    each and the two apart), are descales per token and kv head, as per-token-head quantization
    keeps them; they multiply k_descale's and v_descale's, and each value dequantized by them is
    rounded to q's dtype once. Appending into such a cache gives each new row its own (written in
    place): its largest magnitude (NaN aside) over the fp8 type's largest value (448, 57344) times
    the kv head's descale, or 1 where that is 0 or not finite, so that it fills the fp8 range.
    """
    _no_q_descale(q_descale)
    if cache_leftpad is not None:
        _unsupported("cache_leftpad", "<tensor>", "keep each sequence's keys from the start of "
                     "its cache rows (or pages)")
    scale, causal, left, right, top_left, softcap = _score(softmax_scale, causal, window_size,
                                                           softcap, top_left)
    q = _stride1(with_rank("q", q, 4, "(batch, seqlen_q, heads, head_dim)"))
    cache_layout = "(batch_cache, seqlen_cache, heads_kv, head_dim), or pages with a block_table"
    k_cache = with_rank("k_cache", k_cache, 4, cache_layout)
    v_cache = with_rank("v_cache", v_cache, 4, cache_layout)
    (k, v, rotary_cos, rotary_sin, cache_batch_idx, block_table, alibi_slopes, sinks, k_descale,
     v_descale, k_token_descale, v_token_descale) = _optional(
        k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx,
        block_table=block_table, alibi_slopes=alibi_slopes, sinks=sinks, k_descale=k_descale,
        v_descale=v_descale, k_token_descale=k_token_descale, v_token_descale=v_token_descale)
    k, v = _stride1(k), _stride1(v)
    batch, seqlen_q, heads = q.shape[:3]
    if cache_seqlens is None:
        if block_table is not None:
            _invalid("cache_seqlens is None with a block_table: pass the keys cached per "
                     "sequence (an int or an int32 tensor of batch entries)")
        cache_seqlens = k_cache.shape[1]
    if not isinstance(cache_seqlens, torch.Tensor):
        cache_seqlens = torch.full(
            (batch,), integer("cache_seqlens", cache_seqlens, 0,
                              meaning=", or an int32 tensor of batch entries"),
            dtype=torch.int32, device=k_cache.device)
    out = _output(out, (batch, seqlen_q, heads, v_cache.shape[-1]), q, "out")
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32) \
        if flag("return_softmax_lse", return_softmax_lse) else None
    hooks = _variant(variant, variant_scalars, variant_tensors)
    _run(ops.attention_with_kvcache, q, q, k_cache, v_cache, cache_seqlens, out, lse, k, v,
         rotary_cos, rotary_sin, cache_batch_idx, block_table, alibi_slopes, scale, causal,
         left, right, top_left, softcap, flag("rotary_interleaved", rotary_interleaved),
         integer("num_splits", num_splits, meaning=" (0: kiln's heuristic)"), sinks, k_descale,
         v_descale, k_token_descale, v_token_descale, *hooks)
    return _result(out, lse, "flash_attn_with_kvcache", (q, k, v, sinks, *hooks[3]))


def merge_states(v_a, lse_a, v_b=None, lse_b=None, *, out=None, out_lse=None):
    """Merges attention states over disjoint key sets into the state over their union: with
    v_b and lse_b, two states v (tokens, heads, dv) with float32 natural-log LSEs
    (tokens, heads); without, v_a (tokens, states, heads, dv) and lse_a (tokens, states, heads)
    merge over the states dim. Returns (out, out_lse): out like one state in v_a's dtype, out_lse
    float32 (tokens, heads); out= and out_lse= write there. Any strides (LSEs whose last stride
    is not 1 are copied first), so the LSE of flash_attn_func (batch, heads, seqlen) fits as
    lse[b].transpose(0, 1), with out[b]."""
    many = v_b is None and lse_b is None
    v_b, lse_b, out_lse = _optional(v_b=v_b, lse_b=lse_b, out_lse=out_lse)
    if many:
        tokens, _, heads, dv = with_rank("v_a", v_a, 4, "(tokens, states, heads, head_dim) "
                                         "without v_b and lse_b").shape
        with_rank("lse_a", lse_a, 3, "(tokens, states, heads) without v_b and lse_b")
    elif v_b is None or lse_b is None:
        _invalid("merge_states takes v_b with lse_b (two states) or neither (v_a holds many); "
                 f"got v_b {'None' if v_b is None else 'a tensor'} and lse_b "
                 f"{'None' if lse_b is None else 'a tensor'}")
    else:
        tokens, heads, dv = with_rank("v_a", v_a, 3, "(tokens, heads, head_dim) with v_b and "
                                      "lse_b").shape
        for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
            with_rank(name, lse, 2, "(tokens, heads) with v_b")
    out = _output(out, (tokens, heads, dv), v_a, "out")
    # kiln reads a token's LSEs contiguous (stride 1 over heads); others, such as
    # flash_attn_func's LSE taken as lse[b].transpose(0, 1), are copied so first.
    lse_a, lse_b = (x if x is None or x.stride(-1) == 1 else x.contiguous() for x in (lse_a, lse_b))
    if out_lse is None:
        out_lse = v_a.new_empty((tokens, heads), dtype=torch.float32)
    if many:
        _run(ops.merge_states_many, v_a, v_a, lse_a, out, out_lse)
    else:
        _run(ops.merge_states, v_a, v_a, lse_a, v_b, lse_b, out, out_lse)
    return _result(out, out_lse, "merge_states", (v_a, lse_a, v_b, lse_b))


def _device_index(device):
    if device is None:
        return torch.cuda.current_device() if torch.cuda.is_available() else 0
    if isinstance(device, int) and not isinstance(device, bool):
        return integer("device", device, 0, meaning=" (a GPU ordinal)")
    if not isinstance(device, (str, torch.device)):
        _checks.wrong_type("device", device, "an int, 'cuda:N' or a torch.device")
    try:
        device = torch.device(device)
    except (RuntimeError, ValueError) as e:
        _invalid(f"device={device!r} is no device torch knows ({e}): pass an int, 'cuda:N' or a "
                 f"torch.device of type cuda")
    if device.type != "cuda":
        _invalid(f"device={device}: kiln warms GPU devices; pass an int, 'cuda:N' or a "
                 f"torch.device of type cuda")
    return device.index if device.index is not None else torch.cuda.current_device()


def _warmup_arguments(device, target, threads):
    """warmup's arguments as kiln_warmup takes them; without a target to compile for, the GPU
    to load on must be there, and the fix (a target) is said in Python."""
    index = _device_index(device)
    target = None if target is None else _checks.text("target", target, "sm_90a")
    threads = integer("threads", threads, 0, meaning=" (0: one per hardware thread)")
    if target is None and not os.environ.get("KILN_TARGET") \
            and index >= torch.cuda.device_count():
        seen = (f"torch sees {torch.cuda.device_count()} GPU(s)" if torch.cuda.is_available()
                else "torch sees no GPU (torch.cuda.is_available() is False)")
        raise KilnError(KILN_ERROR_NOT_FOUND,
                        f"kiln.warmup() loads kernels onto GPU {index}, and {seen}: to compile "
                        f"without a GPU, pass the target to compile for, e.g. "
                        f"kiln.warmup(target='sm_90a') (sm_80, sm_90a, gfx90a, ...)")
    return index, target, threads


def warmup(device=None, target=None, threads=0, *, progress=None):
    """Compiles (or finds in the disk cache) kiln's default kernel set and loads it on `device`
    (an int, 'cuda:N' or torch.device; None: torch's current device), so that later calls,
    CUDA graph capture included, load nothing. target ("sm_90a", "gfx90a") compiles for that
    target instead, with no GPU needed; threads 0: one per hardware thread. progress: a bar on
    stderr (True), none (False), or a bar when stderr is a terminal (None)."""
    arguments = _warmup_arguments(device, target, threads)
    bar = _progress.bar_for(progress)
    try:
        _capi.warmup(*arguments, bar)
    finally:
        if bar is not None:
            bar.close()


def info():
    """What this kiln is and sees: its version, library and the commit that library was built
    from, torch's version and devices, and the KILN_* variables set (the `kiln info` command,
    installed with the C++ library, says more)."""
    devices = []
    if torch.cuda.is_available():
        devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "version": _capi.version(),
        "library": _capi.path,
        "build": _capi.build_id(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_hip": getattr(torch.version, "hip", None),
        "devices": devices,
        "env": {name: value for name, value in os.environ.items() if name.startswith("KILN_")},
    }
