# SPDX-License-Identifier: Apache-2.0
"""kiln's torch custom ops (namespace kiln), one per C call, and the path an eager call takes
around them.

Two kinds of op:
- attention, attention_with_kvcache, merge_states and merge_states_many write into tensors
  their caller allocated (`out`, `lse`, and the KV cache when appending) and return nothing, so
  each declares mutates_args and its fake kernel has no shape to compute: the Python calls
  (kiln.interface) allocate the outputs, which torch.compile traces like any other allocation.
  torch refuses an autograd formula for an op that mutates its arguments, so outputs of these
  that need one pass through NoBackward, whose backward raises;
- attention_forward and attention_backward are functional (they allocate and return their
  outputs, and mutate nothing), so that autograd can attach: attention_forward has
  attention_backward, over kiln_attention_backward, as its registered autograd formula. The
  Python calls take them when an input requires grad (attention_with_grad).
No op reads a tensor's values on the host.

Eager calls on plain CUDA tensors skip the dispatcher and call the implementation directly: the
dispatcher adds about 16 us a call (python/bench_host.py), more than a call's whole budget, and
its autograd wrapper of a custom op some 150 us more, so an eager call that needs a gradient
records the op's own formula through a torch.autograd.Function (_EagerAttention). Anything else
(torch.compile tracing, FakeTensor and meta tensors, tensor subclasses, CPU tensors) goes
through the op.
"""
import ctypes
import functools
from typing import List, Optional, Tuple

import torch

from . import _capi, _checks
from ._capi import KilnError

Tensor = torch.Tensor

# DLPack (code, bits) of the dtypes kiln's C API reads (_checks refuses the others).
_DTYPES = {
    torch.float16: (_capi.KDL_FLOAT, 16),
    torch.bfloat16: (_capi.KDL_BFLOAT, 16),
    torch.float32: (_capi.KDL_FLOAT, 32),
    torch.float64: (_capi.KDL_FLOAT, 64),
    torch.int32: (_capi.KDL_INT, 32),
    torch.int64: (_capi.KDL_INT, 64),
    torch.float8_e4m3fn: (_capi.KDL_FLOAT8_E4M3FN, 8),
    torch.float8_e5m2: (_capi.KDL_FLOAT8_E5M2, 8),
}
# ROCm builds of torch call their devices "cuda" too.
_GPU = _capi.KDL_ROCM if getattr(torch.version, "hip", None) else _capi.KDL_CUDA
_NULL = 0
_scratch = _capi.scratch
_PACKERS = _capi.TENSOR_PACKERS
_COMPACT_PACKERS = _capi.COMPACT_PACKERS

try:
    _raw_stream = torch._C._cuda_getCurrentRawStream  # what torch.compile's generated code calls
except AttributeError:  # a torch built without CUDA: no stream to find
    def _raw_stream(device):
        return 0

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # torch 2.4 has it in torch._dynamo
    _is_compiling = torch._dynamo.is_compiling


def _tensor(slot, t, name):
    """Packs torch tensor t into this thread's DLTensor `slot`; returns its address. One that
    cannot be packed (a dtype DLPack has no code for here, a rank beyond the slot's) is refused
    by the rules (_checks), naming it."""
    dtype = _DTYPES.get(t.dtype)
    if dtype is None or t.dim() > _capi.MAX_RANK:
        _checks.known(t, name)
    device = t.get_device()
    kind, device = (_GPU, device) if device >= 0 else _checks.cpu_device
    # data points at element 0 (data_ptr() includes a view's offset), so byte_offset is 0.
    s = _scratch
    offset, address, sizes, strides = s.slots[slot]
    shape = t.shape
    n = len(shape)
    if t.is_contiguous():
        _COMPACT_PACKERS[n](s.buffer, offset, t.data_ptr(), kind, device, n, dtype[0], dtype[1],
                            1, sizes, _NULL, 0, *shape)
    else:
        _PACKERS[n](s.buffer, offset, t.data_ptr(), kind, device, n, dtype[0], dtype[1], 1,
                    sizes, strides, 0, *shape, *t.stride())
    return address


def _maybe(slot, t, name):
    return _NULL if t is None else _tensor(slot, t, name)


def _stream(t):
    device = t.get_device()
    return _raw_stream(device) if device >= 0 else _NULL


def _check(status):
    """Raises kiln's error for a nonzero status; during CUDA graph capture, a missing kernel
    (kiln cannot load one while a stream captures) gets the Python fix."""
    if not status:
        return
    message = _capi.last_error()
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        message += (" [during CUDA graph capture: call kiln.warmup(device) or run the same call "
                    "once before capturing, so that its kernels are loaded]")
    raise _capi.error(status, message)


def eager(t):
    """Whether a call on t may skip the dispatcher: a plain CUDA tensor outside tracing."""
    return type(t) is Tensor and t.is_cuda and not _is_compiling()


def needs_grad(tensors):
    """Whether any of these tensors (None entries are skipped) requires grad."""
    for t in tensors:
        if t is not None and t.requires_grad:
            return True
    return False


class NoBackward(torch.autograd.Function):
    """Identity on the output of a kiln call without a backward, recorded so that a backward
    through it raises."""

    @staticmethod
    def forward(ctx, out, what, *inputs):
        ctx.what = what
        return out.view_as(out)

    @staticmethod
    def backward(ctx, *grads):
        raise _capi.KilnNotImplementedError(
            _capi.KILN_ERROR_UNSUPPORTED,
            f"kiln.{ctx.what} has no backward: kiln differentiates flash_attn_func, "
            f"flash_attn_varlen_func and their qkvpacked and kvpacked forms. Run it under "
            f"torch.no_grad() or torch.inference_mode(), or compute what needs a gradient with "
            f"one of those")


# The implementation behind each op, for eager calls (see the module's docstring).
direct = {}


def _op(fn, mutates_args, check):
    """fn (named _<op>) as the custom op kiln::<op>, with `check`, which takes the op's
    arguments and applies kiln._checks' rules to them, as its fake kernel: for an op that writes
    into tensors its caller made there is no shape to compute and `check` returns nothing; a
    functional op's returns new tensors of its outputs' shapes. Either way, what the real call
    refuses, tracing refuses too. The real call asks libkiln first and, when it refuses, `check`:
    a refusal is said in the same words traced or not, and a call libkiln takes pays for no
    Python check."""
    @functools.wraps(fn)  # the op's schema is read from fn's signature
    def checked(*args):
        try:
            return fn(*args)
        except KilnError as e:
            refused = e
        check(*args)
        raise refused

    op = torch.library.custom_op(f"kiln::{fn.__name__[1:]}", checked, mutates_args=mutates_args)
    op.register_fake(check)
    direct[op] = checked
    return op


def _variant(name, code, scalars, tensors):
    """A user variant's fields of the options' score (_capi.pack_attention_options), and the
    strings they point into, which the caller keeps alive for the call."""
    if name is None and code is None and not scalars and not tensors:
        return _capi.NO_VARIANT, None
    if len(scalars) > _capi.VARIANT_SCALARS or len(tensors) > _capi.VARIANT_TENSORS:
        _checks.variant(scalars, tensors)  # more than the fields hold
    strings = tuple(None if text is None else _capi.c_string(text) for text in (name, code))
    addresses = [_tensor(_capi.VARIANT_SLOT + i, t, f"variant_tensors[{i}]")
                 for i, t in enumerate(tensors)]
    fields = (*(_NULL if c is None else ctypes.addressof(c) for c in strings), *scalars,
              *(0.0,) * (_capi.VARIANT_SCALARS - len(scalars)), len(tensors), *addresses,
              *(_NULL,) * (_capi.VARIANT_TENSORS - len(tensors)))
    return fields, strings


# --- kiln_attention ----------------------------------------------------------------------------

def _attention_options(bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                       max_seqlen_k, softmax_scale, causal, window_left, window_right, top_left,
                       softcap, sinks, variant, k_descale=None, v_descale=None, q_descale=None):
    """kiln_attention_options of the forward and the backward, packed with their tensors
    (`variant`: the score's variant fields, from _variant); returns its address."""
    score = (softmax_scale, causal, window_left, window_right, top_left, softcap,
             _maybe(5, alibi_slopes, "alibi_slopes"), _maybe(10, sinks, "sinks")) + variant
    return _capi.pack_attention_options(
        score, _maybe(6, bias, "bias"), _maybe(7, cu_seqlens_q, "cu_seqlens_q"),
        _maybe(8, cu_seqlens_k, "cu_seqlens_k"), _maybe(9, seqused_k, "seqused_k"), max_seqlen_q,
        max_seqlen_k, _maybe(14, k_descale, "k_descale"), _maybe(15, v_descale, "v_descale"),
        _maybe(16, q_descale, "q_descale"))


def _attention(q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Optional[Tensor],
               bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
               cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
               seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool, window_left: int, window_right: int,
               top_left: bool, softcap: float, sinks: Optional[Tensor],
               k_descale: Optional[Tensor], v_descale: Optional[Tensor],
               q_descale: Optional[Tensor], variant_name: Optional[str],
               variant_code: Optional[str],
               variant_scalars: List[float], variant_tensors: List[Tensor]) -> None:
    variant, keep_alive = _variant(variant_name, variant_code, variant_scalars, variant_tensors)
    options = _attention_options(bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                 max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                 window_right, top_left, softcap, sinks, variant, k_descale,
                                 v_descale, q_descale)
    _check(_capi.attention(_tensor(0, q, "q"), _tensor(1, k, "k"), _tensor(2, v, "v"),
                           _tensor(3, out, "out"), options, _maybe(4, lse, "lse"), _stream(q)))


attention = _op(_attention, mutates_args=("out", "lse"), check=_checks.attention)


# --- kiln_attention and kiln_attention_backward, functional, with autograd -----------------------


def _forward_outputs(q, v, varlen):
    """New tensors for a forward's out, like q with v's head dim, and its lse, float32
    (batch, heads, seqlen_q), or (heads, total_q) with varlen; None for a q of another rank,
    which the rules refuse."""
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    if q.dim() != (3 if varlen else 4):
        return out, None
    shape = (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])
    return out, q.new_empty(shape, dtype=torch.float32)


def _attention_forward(q: Tensor, k: Tensor, v: Tensor, bias: Optional[Tensor],
                       alibi_slopes: Optional[Tensor], cu_seqlens_q: Optional[Tensor],
                       cu_seqlens_k: Optional[Tensor], seqused_k: Optional[Tensor],
                       max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
                       window_left: int, window_right: int, top_left: bool, softcap: float,
                       sinks: Optional[Tensor], variant_name: Optional[str],
                       variant_code: Optional[str], variant_scalars: List[float],
                       variant_tensors: List[Tensor], deterministic: bool
                       ) -> Tuple[Tensor, Tensor]:
    """kiln_attention returning (out, lse), for autograd; `deterministic` is the backward's
    (grads.deterministic), kept for it."""
    out, lse = _forward_outputs(q, v, cu_seqlens_q is not None or cu_seqlens_k is not None)
    _attention(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
               max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
               top_left, softcap, sinks, None, None, None, variant_name, variant_code,
               variant_scalars, variant_tensors)
    return out, lse


def _attention_forward_fake(q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
                            max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                            window_right, top_left, softcap, sinks, variant_name, variant_code,
                            variant_scalars, variant_tensors, deterministic):
    out, lse = _forward_outputs(q, v, cu_seqlens_q is not None or cu_seqlens_k is not None)
    _checks.attention(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                      seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                      window_right, top_left, softcap, sinks, None, None, None, variant_name,
                      variant_code, variant_scalars, variant_tensors)
    return out, lse


attention_forward = _op(_attention_forward, mutates_args=(), check=_attention_forward_fake)


def _gradients(q, k, v, sinks, bias, varlen, dsinks_wanted, dbias_wanted):
    """New tensors for dq, dk, dv (q's, k's and v's shapes and dtypes), dsinks (float32 like
    sinks) and dbias (bias's shape and dtype, dense: kiln writes each element, and autograd sums
    those of a stride-0 bias's broadcast dims), each of the last two empty when not wanted (an op
    returns a tensor in each place). Varlen ones start at zero: tokens that cu_seqlens leaves out
    of every sequence get no gradient from the kernels, and theirs is 0."""
    dsinks = (0,) if sinks is None or not dsinks_wanted else sinks.shape
    dbias = q.new_empty((0,)) if bias is None or not dbias_wanted else bias.new_empty(bias.shape)
    new = (lambda t: t.new_zeros(t.shape)) if varlen else (lambda t: t.new_empty(t.shape))
    return new(q), new(k), new(v), q.new_empty(dsinks, dtype=torch.float32), dbias


def _attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                        bias: Optional[Tensor], alibi_slopes: Optional[Tensor],
                        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                        seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                        softmax_scale: float, causal: bool, window_left: int, window_right: int,
                        top_left: bool, softcap: float, sinks: Optional[Tensor],
                        variant_name: Optional[str], variant_code: Optional[str],
                        variant_scalars: List[float], variant_tensors: List[Tensor],
                        deterministic: bool, dsinks_wanted: bool, dbias_wanted: bool
                        ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """kiln_attention_backward: (dq, dk, dv, dsinks, dbias) of attention_forward's call on the
    same arguments, given dout; dsinks is empty unless dsinks_wanted (and sinks given), dbias
    unless dbias_wanted (and a bias given)."""
    dq, dk, dv, dsinks, dbias = _gradients(q, k, v, sinks, bias, cu_seqlens_q is not None,
                                           dsinks_wanted, dbias_wanted)
    variant, keep_alive = _variant(variant_name, variant_code, variant_scalars, variant_tensors)
    options = _attention_options(bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
                                 max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                                 window_right, top_left, softcap, sinks, variant)
    at = _capi.BACKWARD_SLOT
    grads = _capi.pack_grad_options(
        deterministic, _maybe(at + 4, dsinks if dsinks.numel() else None, "dsinks"),
        _maybe(at + 5, dbias if dbias.numel() else None, "dbias"))
    _check(_capi.attention_backward(
        _tensor(0, q, "q"), _tensor(1, k, "k"), _tensor(2, v, "v"), _tensor(3, out, "out"),
        _tensor(at, dout, "dout"), _tensor(at + 1, dq, "dq"), _tensor(at + 2, dk, "dk"),
        _tensor(at + 3, dv, "dv"), options, _tensor(4, lse, "lse"), grads, _stream(q)))
    return dq, dk, dv, dsinks, dbias


def _attention_backward_fake(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q,
                             cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                             causal, window_left, window_right, top_left, softcap, sinks,
                             variant_name, variant_code, variant_scalars, variant_tensors,
                             deterministic, dsinks_wanted, dbias_wanted):
    _checks.attention_backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q,
                               cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale, causal, window_left, window_right, top_left,
                               softcap, sinks, variant_name, variant_code, variant_scalars,
                               variant_tensors)
    return _gradients(q, k, v, sinks, bias, cu_seqlens_q is not None, dsinks_wanted,
                      dbias_wanted)


attention_backward = _op(_attention_backward, mutates_args=(), check=_attention_backward_fake)

# attention_forward's arguments by position, as setup_context and the backward read them.
_BIAS, _ALIBI_SLOPES, _SINKS, _VARIANT_SCALARS, _VARIANT_TENSORS, _DETERMINISTIC = \
    3, 4, 16, 19, 20, 21


def _setup_context(ctx, inputs, output):
    q, k, v, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, *scalars = inputs
    *scalars, sinks, variant_name, variant_code, variant_scalars, variant_tensors, \
        deterministic = scalars
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                          seqused_k, sinks, *variant_tensors)
    ctx.scalars = scalars  # max_seqlen_q and _k, then the score's
    ctx.variant = (variant_name, variant_code, variant_scalars)
    ctx.deterministic = deterministic
    # FlashAttention's semantics: the LSE is an output for inspection (or merging), not
    # differentiated; marked so, a loss through it alone has no grad_fn rather than a wrong one.
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, sinks, \
        *variant_tensors = ctx.saved_tensors
    for name, at in (("alibi_slopes", _ALIBI_SLOPES), ("variant_tensors", _VARIANT_TENSORS)):
        if any(torch.utils._pytree.tree_leaves(ctx.needs_input_grad[at])):
            # kiln.interface refuses these at the forward
            raise _capi.KilnNotImplementedError(
                _capi.KILN_ERROR_UNSUPPORTED,
                f"kiln::attention_forward's {name} requires grad: kiln computes no gradient "
                f"for it; pass it detached")
    dsinks_wanted = sinks is not None and ctx.needs_input_grad[_SINKS]
    dbias_wanted = bias is not None and ctx.needs_input_grad[_BIAS]
    # kiln reads dout with unit stride on its last dim and 16-byte aligned rows; autograd may
    # hand it expanded (the gradient of a sum) or as any view.
    dout = dout.contiguous()
    backward = direct[attention_backward] if eager(dout) else attention_backward
    dq, dk, dv, dsinks, dbias = backward(
        dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
        *ctx.scalars, sinks, *ctx.variant, variant_tensors, ctx.deterministic, dsinks_wanted,
        dbias_wanted)
    grads = [None] * (_DETERMINISTIC + 1)  # one per argument of attention_forward
    grads[:3] = dq, dk, dv
    grads[_BIAS] = dbias if dbias_wanted else None
    grads[_SINKS] = dsinks if dsinks_wanted else None
    # In the structure autograd checks the variant's lists against.
    grads[_VARIANT_SCALARS] = _no_gradient(ctx.variant[2])
    grads[_VARIANT_TENSORS] = _no_gradient(variant_tensors)
    return tuple(grads)


def _no_gradient(argument):
    """An argument's lack of a gradient in the structure autograd checks it against: None, or
    for a list of tensors (an empty list counts as one) a list of Nones."""
    if isinstance(argument, (list, tuple)) and all(isinstance(x, Tensor) for x in argument):
        return [None] * len(argument)
    return None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """attention_forward and its registered formula (the same setup_context and backward)
    around the implementations themselves, for eager calls: through the dispatcher, torch's
    autograd wrapper of a custom op costs about 150 us a forward (python/bench_host.py)."""

    @staticmethod
    def forward(ctx, *inputs):
        output = direct[attention_forward](*inputs)
        _setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, *grads):
        # A Function's list argument (the variant's tensors) is no input of autograd's: None.
        return tuple(None if isinstance(g, list) else g for g in _backward(ctx, *grads))


def attention_with_grad(*arguments):
    """attention_forward(*arguments) with its backward recorded: straight to the implementation
    when eager, else through the op (which torch.compile traces, forward and backward)."""
    if eager(arguments[0]):
        return _EagerAttention.apply(*arguments)
    return attention_forward(*arguments)


# --- kiln_attention_with_kvcache -----------------------------------------------------------------

def _attention_with_kvcache(
        q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor, out: Tensor,
        lse: Optional[Tensor], k: Optional[Tensor], v: Optional[Tensor],
        rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
        cache_batch_idx: Optional[Tensor], block_table: Optional[Tensor],
        alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int,
        window_right: int, top_left: bool, softcap: float, rotary_interleaved: bool,
        num_splits: int, sinks: Optional[Tensor], k_descale: Optional[Tensor],
        v_descale: Optional[Tensor], k_token_descale: Optional[Tensor],
        v_token_descale: Optional[Tensor], variant_name: Optional[str],
        variant_code: Optional[str], variant_scalars: List[float],
        variant_tensors: List[Tensor]) -> None:
    variant, keep_alive = _variant(variant_name, variant_code, variant_scalars, variant_tensors)
    cache = _capi.pack_cache(_tensor(1, k_cache, "k_cache"), _tensor(2, v_cache, "v_cache"),
                             _tensor(3, cache_seqlens, "cache_seqlens"),
                             _maybe(4, cache_batch_idx, "cache_batch_idx"),
                             _maybe(5, block_table, "block_table"),
                             _maybe(14, k_descale, "k_descale"),
                             _maybe(15, v_descale, "v_descale"),
                             _maybe(16, k_token_descale, "k_token_descale"),
                             _maybe(17, v_token_descale, "v_token_descale"))
    score = (softmax_scale, causal, window_left, window_right, top_left, softcap,
             _maybe(6, alibi_slopes, "alibi_slopes"), _maybe(13, sinks, "sinks")) + variant
    options = _capi.pack_decode_options(
        score, _maybe(7, k, "k"), _maybe(8, v, "v"), _maybe(9, rotary_cos, "rotary_cos"),
        _maybe(10, rotary_sin, "rotary_sin"), rotary_interleaved, num_splits)
    _check(_capi.attention_with_kvcache(_tensor(0, q, "q"), cache, _tensor(11, out, "out"),
                                        options, _maybe(12, lse, "lse"), _stream(q)))


# NOTE: the cache (and its token descales) is declared mutated even without k and v: a schema is
# fixed per op.
attention_with_kvcache = _op(_attention_with_kvcache,
                             mutates_args=("k_cache", "v_cache", "out", "lse", "k_token_descale",
                                           "v_token_descale"),
                             check=_checks.attention_with_kvcache)


# --- kiln_merge_states, kiln_merge_states_many -------------------------------------------------

def _merge_states(v_a: Tensor, lse_a: Tensor, v_b: Tensor, lse_b: Tensor, out: Tensor,
                  out_lse: Optional[Tensor]) -> None:
    _check(_capi.merge_states(_tensor(0, v_a, "v_a"), _tensor(1, lse_a, "lse_a"),
                              _tensor(2, v_b, "v_b"), _tensor(3, lse_b, "lse_b"),
                              _tensor(4, out, "out"), _maybe(5, out_lse, "out_lse"),
                              _stream(out)))


merge_states = _op(_merge_states, mutates_args=("out", "out_lse"), check=_checks.merge_states)


def _merge_states_many(v: Tensor, lse: Tensor, out: Tensor, out_lse: Optional[Tensor]) -> None:
    _check(_capi.merge_states_many(_tensor(0, v, "v"), _tensor(1, lse, "lse"),
                                   _tensor(2, out, "out"), _maybe(3, out_lse, "out_lse"),
                                   _stream(out)))


merge_states_many = _op(_merge_states_many, mutates_args=("out", "out_lse"),
                        check=_checks.merge_states_many)
