"""FlashAttention's calls (flash_attn 2.x's flash_attn_interface: names, argument order and
defaults) over kiln's ops, plus kiln's own: merge_states, warmup, info.

kiln's extras are keyword-only: an additive `bias` (any strides), `top_left` band alignment,
`return_softmax_lse` (where FlashAttention has it only for the KV cache), and `out=`. An argument
of FlashAttention's that kiln cannot honour (dropout, attention probabilities, a paged varlen
call, cache_leftpad) raises a KilnError naming it; none is ignored.
"""
import os

import torch

from . import _capi, _progress, ops
from ._capi import KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_UNSUPPORTED, KilnError, KilnValueError
from .variant import Variant


def _unsupported(argument, value, instead):
    raise KilnError(KILN_ERROR_UNSUPPORTED,
                    f"{argument}={value!r} is not supported by kiln: {instead}")


def _invalid(message):
    raise KilnValueError(KILN_ERROR_INVALID_ARGUMENT, message)


_UNBOUNDED = (-1, -1)


def _scale(softmax_scale):
    """kiln's softmax_scale argument: 0 means FlashAttention's default, 1 / sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    if not softmax_scale > 0:  # also NaN
        _invalid(f"softmax_scale={softmax_scale!r}: pass a positive scale, or None for "
                 f"1 / sqrt(head_dim)")
    return float(softmax_scale)


def _window(window_size):
    """(window_left, window_right) from FlashAttention's window_size: -1 is unbounded."""
    if window_size == _UNBOUNDED:  # the default, first: every call pays for this check
        return _UNBOUNDED
    try:
        left, right = window_size
        if left == int(left) and right == int(right) and left >= -1 and right >= -1:
            return int(left), int(right)
    except (TypeError, ValueError):
        pass
    _invalid(f"window_size={window_size!r}: pass (left, right), each a key count >= 0 or -1 "
             f"for unbounded")


def _seqlen(name, value):
    # A tensor here would need .item(), a host sync that torch.compile and CUDA graphs refuse.
    if isinstance(value, bool) or not isinstance(value, int):
        _invalid(f"{name} is a {type(value).__name__}: pass a Python int, as FlashAttention "
                 f"takes it (the longest sequence in the batch)")
    return value


def _forward_only(dropout_p, return_attn_probs):
    if dropout_p != 0.0:
        _unsupported("dropout_p", dropout_p, "kiln has no dropout; pass dropout_p=0.0 (as "
                     "FlashAttention asks for evaluation)")
    if return_attn_probs:
        _unsupported("return_attn_probs", return_attn_probs,
                     "kiln never forms the attention probabilities; for the softmax LSE pass "
                     "return_softmax_lse=True, which returns (out, softmax_lse)")


def _stride1(t):
    """t with a unit stride on its last dim, as kiln needs (and FlashAttention makes)."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _output(out, shape, like, name):
    """`out` checked against the shape and dtype the call writes, or a new tensor."""
    if out is None:
        return like.new_empty(shape)
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype:
        _invalid(f"{name} has shape {tuple(out.shape)} and dtype {out.dtype}: this call writes "
                 f"{tuple(shape)} {like.dtype}")
    return out


def _run(op, first, *args):
    """One op call: straight to its implementation when eager (kiln.ops says why)."""
    if ops.eager(first):
        ops.direct[op](*args)
    else:
        op(*args)


def _variant(variant, scalars, tensors):
    """The ops' variant arguments (name, code, scalars, tensors) from the calls' keywords."""
    if variant is None:
        if scalars or tensors:
            _invalid("variant_scalars or variant_tensors without a variant: pass variant="
                     "kiln.Variant(name, code), or neither")
        return None, None, [], []
    if not isinstance(variant, Variant):
        _invalid(f"variant is a {type(variant).__name__}: pass a kiln.Variant(name, code)")
    try:
        scalars = [float(x) for x in scalars]
    except (TypeError, ValueError):
        _invalid(f"variant_scalars={scalars!r}: pass a sequence of up to 8 numbers")
    return variant.name, variant.code, scalars, list(tensors)


def _result(out, lse, what, inputs):
    if torch.is_grad_enabled() and ops.needs_grad(inputs):
        out = ops.NoBackward.apply(out, what, *inputs)
    return out if lse is None else (out, lse)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, bias=None, top_left=False,
                    return_softmax_lse=False, out=None, sinks=None, variant=None,
                    variant_scalars=(), variant_tensors=()):
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
    any dtype and strides), which change without a recompile. The forward is deterministic
    (`deterministic` concerns the backward pass, which kiln does not have yet: a backward
    through the result raises).
    """
    _forward_only(dropout_p, return_attn_probs)
    left, right = _window(window_size)
    q, k, v = _stride1(q), _stride1(k), _stride1(v)
    batch, seqlen_q, heads = q.shape[:3]
    out = _output(out, (batch, seqlen_q, heads, v.shape[-1]), q, "out")
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32) if return_softmax_lse \
        else None
    hooks = _variant(variant, variant_scalars, variant_tensors)
    _run(ops.attention, q, q, k, v, out, lse, bias, alibi_slopes, None, None, None, 0, 0,
         _scale(softmax_scale), causal, left, right, top_left, softcap, sinks, *hooks)
    return _result(out, lse, "flash_attn_func", (q, k, v, bias, sinks, *hooks[3]))


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, seqused_k=None,
                           bias=None, top_left=False, return_softmax_lse=False, out=None,
                           sinks=None, variant=None, variant_scalars=(), variant_tensors=()):
    """flash_attn_func over packed sequences, as FlashAttention's flash_attn_varlen_func: q
    (total_q, heads, d), k and v (total_k, heads_kv, d / dv), sequence b at
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] (int32, batch + 1); max_seqlen_q/k are Python ints.
    out (total_q, heads, dv); softmax_lse float32 (heads, total_q).

    kiln's keyword-only extras: those of flash_attn_func, and seqused_k (int32, batch): the keys
    each sequence uses, from its start (FlashAttention 3's); a variant's key index counts from
    its sequence's start. block_table (a paged varlen call)
    is not supported: use flash_attn_with_kvcache for a paged cache.
    """
    _forward_only(dropout_p, return_attn_probs)
    if block_table is not None:
        _unsupported("block_table", "<tensor>", "kiln's varlen attention reads contiguous k and "
                     "v; for a paged cache call flash_attn_with_kvcache")
    left, right = _window(window_size)
    q, k, v = _stride1(q), _stride1(k), _stride1(v)
    total_q, heads = q.shape[:2]
    out = _output(out, (total_q, heads, v.shape[-1]), q, "out")
    lse = q.new_empty((heads, total_q), dtype=torch.float32) if return_softmax_lse else None
    hooks = _variant(variant, variant_scalars, variant_tensors)
    _run(ops.attention, q, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
         seqused_k, _seqlen("max_seqlen_q", max_seqlen_q),
         _seqlen("max_seqlen_k", max_seqlen_k), _scale(softmax_scale), causal, left, right,
         top_left, softcap, sinks, *hooks)
    return _result(out, lse, "flash_attn_varlen_func", (q, k, v, bias, sinks, *hooks[3]))


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, top_left=False, out=None, sinks=None,
                            variant=None, variant_scalars=(), variant_tensors=()):
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
    """
    if cache_leftpad is not None:
        _unsupported("cache_leftpad", "<tensor>", "keep each sequence's keys from the start of "
                     "its cache rows (or pages)")
    left, right = _window(window_size)
    q, k, v = _stride1(q), _stride1(k), _stride1(v)
    batch, seqlen_q, heads = q.shape[:3]
    if cache_seqlens is None:
        if block_table is not None:
            _invalid("cache_seqlens is None with a block_table: pass the keys cached per "
                     "sequence (an int or an int32 tensor of batch entries)")
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32,
                                   device=k_cache.device)
    out = _output(out, (batch, seqlen_q, heads, v_cache.shape[-1]), q, "out")
    lse = q.new_empty((batch, heads, seqlen_q), dtype=torch.float32) if return_softmax_lse \
        else None
    hooks = _variant(variant, variant_scalars, variant_tensors)
    _run(ops.attention_with_kvcache, q, q, k_cache, v_cache, cache_seqlens, out, lse, k, v,
         rotary_cos, rotary_sin, cache_batch_idx, block_table, alibi_slopes,
         _scale(softmax_scale), causal, left, right, top_left, softcap, rotary_interleaved,
         num_splits, sinks, *hooks)
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
    if many:
        tokens, _, heads, dv = v_a.shape
    elif v_b is None or lse_b is None:
        _invalid("merge_states takes v_b with lse_b (two states) or neither (v_a holds many); "
                 f"got v_b {'None' if v_b is None else 'a tensor'} and lse_b "
                 f"{'None' if lse_b is None else 'a tensor'}")
    else:
        tokens, heads, dv = v_a.shape
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
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "cuda":
        _invalid(f"device={device}: kiln warms GPU devices; pass an int, 'cuda:N' or a "
                 f"torch.device of type cuda")
    return device.index if device.index is not None else torch.cuda.current_device()


def warmup(device=None, target=None, threads=0, *, progress=None):
    """Compiles (or finds in the disk cache) kiln's default kernel set and loads it on `device`
    (an int, 'cuda:N' or torch.device; None: torch's current device), so that later calls,
    CUDA graph capture included, load nothing. target ("sm_90a", "gfx90a") compiles for that
    target instead, with no GPU needed; threads 0: one per hardware thread. progress: a bar on
    stderr (True), none (False), or a bar when stderr is a terminal (None)."""
    bar = _progress.bar_for(progress)
    try:
        _capi.warmup(_device_index(device), target, threads, bar)
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
