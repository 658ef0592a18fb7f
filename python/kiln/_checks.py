# SPDX-License-Identifier: Apache-2.0
"""What kiln refuses, said in Python and checked where tensors may be fake.

Two kinds of check, each naming the argument at fault:
- the Python calls' arguments (kiln.interface): a tensor where a tensor goes, numbers and flags
  that kiln's C structs can hold, before anything reads their shapes or packs them;
- each op's rules on its tensors (device, dtype, rank, head dim): one function per op, the op's
  fake kernel (torch.compile, FakeTensor, meta tensors), which the real call runs too when
  libkiln refuses it (kiln.ops._op), so that torch.compile traces only calls the real one runs,
  and a refusal has the same words either way. libkiln has the same rules, in the same words
  (python/tests/test_fake.py compares them): the real call costs no Python check.

A rule that needs sizes to agree (batch, sequence lengths) is left to the library: under dynamic
shapes those sizes are symbols, and checking them here would specialize the trace.
"""
import operator

import torch

from . import _capi
from ._capi import KILN_ERROR_INVALID_ARGUMENT, KILN_ERROR_UNSUPPORTED, KilnTypeError
from ._capi import KilnValueError

# What a CPU tensor is sent to kiln as: refused here, naming it. The tests without a GPU set
# (kiln.ops._GPU, 0) to have kiln check CPU tensors as a GPU's, with its own messages (an empty
# problem then returns before any launch).
cpu_device = (_capi.KDL_CPU, 0)

# kiln::DType's names (to_string(DType)) of the dtypes the C API reads, as its messages say them.
DTYPE_NAMES = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.float8_e4m3fn: "e4m3",
    torch.float8_e5m2: "e5m2",
}
# The operand dtypes (q, k and v, out) kiln's attention kernels take, a row per combination, in
# libkiln's order: the backward's (kOperandDTypes, lib/kernels/attention.cpp), decode's, which
# reads fp8 k and v too (kOperandDTypes in decode.cpp), and the forward's, which also takes
# e4m3 q, k and v with a 16-bit out (kTmaDTypes in attention.cpp).
# The fp8 dtypes kiln reads k and v (and KV caches) in; e4m3 is also an fp8 q's (the all-fp8
# forward).
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_OPERAND_DTYPES = ((torch.bfloat16,) * 3, (torch.float16,) * 3)
_FP8_KV_OPERAND_DTYPES = _OPERAND_DTYPES + tuple(
    (q, kv, q) for kv in FP8_DTYPES for q in (torch.bfloat16, torch.float16))
_FORWARD_OPERAND_DTYPES = _FP8_KV_OPERAND_DTYPES + (
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16),
    (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float16))
# Head dims kiln compiles: every multiple of 8 from 8 to this (kMaxHeadDim in
# lib/ops/tensor_checks.hpp).
MAX_HEAD_DIM = 256
# A C int, which kiln's option structs hold.
INT_MIN, INT_MAX = -2**31, 2**31 - 1
# A C float's largest finite value.
_FLOAT_MAX = 3.4028234663852886e38


def invalid(message):
    raise KilnValueError(KILN_ERROR_INVALID_ARGUMENT, message)


def unsupported(message):
    raise KilnValueError(KILN_ERROR_UNSUPPORTED, message)


def wrong_type(name, value, instead):
    raise KilnTypeError(KILN_ERROR_INVALID_ARGUMENT,
                        f"{name} is {_a(value)}: pass {instead}")


def _a(value):
    """`value`'s type as a message names it: "a str ('x')", "None"."""
    if value is None:
        return "None"
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"a {type(value).__name__} ({shown})"


# --- the Python calls' arguments ----------------------------------------------------------------

def tensor(name, value):
    """`value`, which must be a torch.Tensor."""
    if not isinstance(value, torch.Tensor):
        wrong_type(name, value, "a torch.Tensor")
    return value


def tensor_list(name, values):
    """`values` as a list of tensors, each named by its index."""
    if not isinstance(values, (list, tuple)):
        wrong_type(name, values, "a list or tuple of torch.Tensor")
    return [tensor(f"{name}[{i}]", t) for i, t in enumerate(values)]


def with_rank(name, t, rank, layout):
    """Tensor `t`, of rank `rank` (layout: what its dims are), so that its shape can be read."""
    tensor(name, t)
    if t.dim() != rank:
        invalid(f"{name} has rank {t.dim()} but must have rank {rank}: {layout}")
    return t


def integer(name, value, low=INT_MIN, high=INT_MAX, meaning=""):
    """`value` as an int from `low` to `high` (a C int by default); `meaning` says what it is."""
    if isinstance(value, bool):
        wrong_type(name, value, f"an int{meaning}")
    try:
        value = operator.index(value)
    except TypeError:
        wrong_type(name, value, f"an int{meaning}")
    if not low <= value <= high:
        invalid(f"{name} is {value}: pass {low} to {high}{meaning}")
    return value


def number(name, value, meaning=""):
    """`value` as a float a C float holds (finite, at most about 3.4e38 in magnitude)."""
    if type(value) is float and -_FLOAT_MAX <= value <= _FLOAT_MAX:
        return value  # the common case first: every call passes a few
    if isinstance(value, (str, bytes)):
        wrong_type(name, value, f"a number{meaning}")
    try:
        value = float(value)
    except (TypeError, ValueError):
        wrong_type(name, value, f"a number{meaning}")
    if not -_FLOAT_MAX <= value <= _FLOAT_MAX:  # NaN too; no math.isnan, which dynamo breaks on
        invalid(f"{name}={value!r}: pass a finite number a float32 holds{meaning}")
    return value


def flag(name, value):
    """`value` as a bool: True, False, or an int 0 or 1."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    wrong_type(name, value, "True or False")


def text(name, value, example):
    """`value`, a str without NUL (C reads up to the first)."""
    if not isinstance(value, str):
        wrong_type(name, value, f"a str such as {example!r}")
    if "\0" in value:
        invalid(f"{name}={value!r} holds a NUL character, where C would end it: pass "
                f"{example!r} or the like")
    return value


# --- the ops' rules, on real or fake tensors -----------------------------------------------------

def _on_gpu(t, name):
    """`t` is where kiln runs: a GPU (or a fake or meta tensor standing for one's)."""
    if t.is_cuda or t.is_meta or (t.is_cpu and cpu_device[0] != _capi.KDL_CPU):
        return
    where = "the CPU" if t.is_cpu else f"device {t.device}"
    invalid(f"{name} is on {where}; kiln runs on CUDA or ROCm GPUs: move it to one, e.g. "
            f"{name}.cuda()")


def known(t, name):
    """kiln's name of t's dtype; t is on a GPU, of a rank the C API takes."""
    _on_gpu(t, name)
    if not 1 <= t.dim() <= _capi.MAX_RANK:
        invalid(f"{name} has rank {t.dim()}: expected 1 to {_capi.MAX_RANK}")
    dtype = DTYPE_NAMES.get(t.dtype)
    if dtype is None:
        invalid(f"{name} has dtype {t.dtype}: kiln takes float16 or bfloat16 data, float32 LSE "
                f"and ALiBi slopes, int32 indices")
    return dtype


def _all_known(named):
    for name, t in named:
        if t is not None:
            known(t, name)


def _dtypes(named, dtype, what):
    """Each tensor of `named` present has `dtype` (`what`, as kiln names it)."""
    for name, t in named:
        if t is not None and t.dtype != dtype:
            invalid(f"{name} has dtype {DTYPE_NAMES[t.dtype]}: it must be {what}")


def _lse(t, name, rank, layout):
    if t is not None:
        _dtypes(((name, t),), torch.float32, "f32")
        if t.dim() != rank:
            invalid(f"{name} has rank {t.dim()} but must have rank {rank}: {layout}")


def head_dim(dim, what):
    """The library's check_head_dim (lib/ops/tensor_checks.cpp), word for word."""
    if dim % 8 == 0 and 8 <= dim <= MAX_HEAD_DIM:
        return
    pad = "; pad the head dim with zeros to the next multiple of 8" \
        if 0 < dim < MAX_HEAD_DIM else ""
    unsupported(f"{what} is {dim}: kiln compiles every multiple of 8 from 8 to {MAX_HEAD_DIM}"
                f"{pad}")


def _ranks(q, named):
    """The tile tensors `named` have q's rank."""
    for name, t in named:
        if t.dim() != q.dim():
            invalid(f"{name} has rank {t.dim()} but q has rank {q.dim()}: they share one layout")


def _operand_dtypes(q, kv, out, what, rows=_OPERAND_DTYPES):
    """The library's operand_dtypes_error (lib/kernels/kernel.cpp), word for word: q's dtype, the
    one dtype of the tensors `kv` and out's (a (name, tensor) pair; None: any) make a row of
    `rows`."""
    names = DTYPE_NAMES
    with_q = [row for row in rows if row[0] == q.dtype]
    if not with_q:
        q_dtypes = " or ".join(dict.fromkeys(names[row[0]] for row in rows))
        unsupported(f"q has dtype {names[q.dtype]}: {what} takes {q_dtypes}")
    listed = " or ".join(f"({', '.join(names[d] for d in row)})" for row in rows)

    def refuse(name, t, other_name, other, fit):
        invalid(f"{name} has dtype {names[t.dtype]} but {other_name} has dtype "
                f"{names[other.dtype]}: {what} takes (q, k and v, out) in the dtypes {listed}, "
                f"so {name} needs {names[fit]}")
    for name, t in kv:
        if not any(row[1] == t.dtype for row in with_q):
            refuse(name, t, "q", q, with_q[0][1])
        if t.dtype != kv[0][1].dtype:
            refuse(name, t, *kv[0], kv[0][1].dtype)
    if out is not None:
        with_kv = [row for row in with_q if not kv or row[1] == kv[0][1].dtype]
        if not any(row[2] == out[1].dtype for row in with_kv):
            refuse(*out, "q", q, with_kv[0][2])


def variant(scalars, tensors):
    """A variant's scalars and tensors, of which its fields hold at most so many."""
    if len(scalars) > _capi.VARIANT_SCALARS:
        invalid(f"variant_scalars has {len(scalars)} values: a variant takes at most "
                f"{_capi.VARIANT_SCALARS}")
    if len(tensors) > _capi.VARIANT_TENSORS:
        invalid(f"variant_tensors has {len(tensors)} tensors: a variant takes at most "
                f"{_capi.VARIANT_TENSORS}")
    _all_known((f"variant_tensors[{i}]", t) for i, t in enumerate(tensors))


def attention(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
              max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
              top_left, softcap, sinks, k_descale, v_descale, q_descale, variant_name,
              variant_code, variant_scalars, variant_tensors):
    """kiln::attention's op (kiln.ops.attention): its arguments, as the op takes them."""
    tiles = (("q", q), ("k", k), ("v", v), ("out", out))
    _all_known(tiles + (("lse", lse), ("bias", bias), ("alibi_slopes", alibi_slopes),
                        ("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
                        ("seqused_k", seqused_k), ("sinks", sinks), ("k_descale", k_descale),
                        ("v_descale", v_descale), ("q_descale", q_descale)))
    variant(variant_scalars, variant_tensors)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    if varlen and bias is not None:
        unsupported("bias with varlen is not supported: pad the batch instead")
    if bias is not None and q.dtype in FP8_DTYPES:
        unsupported(f"bias with an {DTYPE_NAMES[q.dtype]} q is not supported yet: add it to the "
                    "scores through a user variant, or pass q, k and v in bf16 or fp16")
    rank = 3 if varlen else 4
    if q.dim() != rank:
        invalid(f"q has rank {q.dim()} but must have rank {rank}: "
                + ("(total_tokens, heads, head_dim) with cu_seqlens" if varlen else
                   "(batch, seqlen, heads, head_dim); for varlen call flash_attn_varlen_func"))
    _ranks(q, tiles[1:])
    _operand_dtypes(q, (("k", k), ("v", v)), ("out", out), "attention", _FORWARD_OPERAND_DTYPES)
    head_dim(q.shape[-1], "head_dim (q.size(-1))")
    head_dim(v.shape[-1], "head_dim_v (v.size(-1))")
    if k.dtype in FP8_DTYPES and (q.shape[-1] % 16 or v.shape[-1] % 16):
        unsupported(f"head_dim {q.shape[-1]} and head_dim_v {v.shape[-1]} with an "
                    f"{DTYPE_NAMES[k.dtype]} K/V: fp8 head dims must be multiples of 16 (16-byte "
                    "copies of whole elements); pad the head dims with zeros")
    _dtypes((("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k),
             ("seqused_k", seqused_k)), torch.int32, "int32")
    _dtypes((("alibi_slopes", alibi_slopes), ("sinks", sinks)), torch.float32, "f32")
    descales(k, k_descale, v_descale)
    q_descale_of(q, q_descale)
    _dtypes((("lse", lse),), torch.float32, "f32")


def attention_backward(dout, q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                       seqused_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
                       window_right, top_left, softcap, sinks, variant_name, variant_code,
                       variant_scalars, variant_tensors):
    """kiln::attention_backward's op (kiln.ops.attention_backward): the forward's rules on the
    forward's arguments, and dout, the gradient of out, in out's dtype and rank."""
    attention(q, k, v, out, lse, bias, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k,
              max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right,
              top_left, softcap, sinks, None, None, None, variant_name, variant_code,
              variant_scalars, variant_tensors)
    _operand_dtypes(q, (("k", k), ("v", v)), None, "attention's backward")
    known(dout, "dout")
    _ranks(q, (("dout", dout),))
    _dtypes((("dout", dout),), out.dtype, f"out's, {DTYPE_NAMES[out.dtype]}")


def descales(k, k_descale, v_descale):
    """fp8 k and v's descales (flash_attn_func's): with fp8 k only, float32 of rank 2."""
    _descales((("k_descale", k_descale), ("v_descale", v_descale)), k, "fp8 k and v", "k", 2,
              "(batch, heads_kv) fp32 descales")


def q_descale_of(q, q_descale):
    """An fp8 q's descale (flash_attn_func's): with an fp8 q only, float32 of rank 2."""
    _descales((("q_descale", q_descale),), q, "an fp8 q", "q", 2,
              "(batch, heads_kv) fp32 descales")


def _descales(named, k, fp8_kv, holder, rank, layout):
    """fp8 k and v's descale tensors, those given: with an fp8 `k` only (`fp8_kv` names the K/V
    in messages, "an fp8 cache", and `holder` the tensor k is, "the cache"), of `rank`,
    float32."""
    for name, t in named:
        if t is None:
            continue
        if k.dtype not in FP8_DTYPES:
            invalid(f"{name} is for {fp8_kv}, but {holder} has dtype {DTYPE_NAMES[k.dtype]}: "
                    f"drop {name}")
        if t.dim() != rank:
            invalid(f"{name} has rank {t.dim()} but must have rank {rank}: {layout}")
        _dtypes(((name, t),), torch.float32, "float32")


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, out, lse, k, v, rotary_cos,
                           rotary_sin, cache_batch_idx, block_table, alibi_slopes, softmax_scale,
                           causal, window_left, window_right, top_left, softcap,
                           rotary_interleaved, num_splits, sinks, k_descale, v_descale,
                           k_token_descale, v_token_descale, variant_name, variant_code,
                           variant_scalars, variant_tensors):
    """kiln::attention_with_kvcache's op (kiln.ops.attention_with_kvcache)."""
    tiles = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out))
    news = tuple((name, t) for name, t in (("k", k), ("v", v)) if t is not None)
    _all_known(tiles + news + (("cache_seqlens", cache_seqlens), ("lse", lse),
                               ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                               ("cache_batch_idx", cache_batch_idx),
                               ("block_table", block_table), ("alibi_slopes", alibi_slopes),
                               ("sinks", sinks), ("k_descale", k_descale),
                               ("v_descale", v_descale), ("k_token_descale", k_token_descale),
                               ("v_token_descale", v_token_descale)))
    variant(variant_scalars, variant_tensors)
    if q.dim() != 4:
        invalid(f"q has rank {q.dim()} but must have rank 4: (batch, seqlen_q, heads, head_dim)")
    _ranks(q, tiles[1:] + news)
    cache = (("k_cache", k_cache), ("v_cache", v_cache))
    _operand_dtypes(q, cache, ("out", out), "decode attention", _FP8_KV_OPERAND_DTYPES)
    fp8 = k_cache.dtype in FP8_DTYPES
    if fp8:
        # The append quantizes q's dtype into the cache by the descales.
        for name, t in news:
            if t.dtype != q.dtype:
                invalid(f"{name} has dtype {DTYPE_NAMES[t.dtype]} with an "
                        f"{DTYPE_NAMES[k_cache.dtype]} cache: pass k and v in q's dtype "
                        f"({DTYPE_NAMES[q.dtype]}), which kiln quantizes into the cache (divided "
                        "by the descales, saturating)")
    else:
        _operand_dtypes(q, cache[:1] + news, None, "decode attention", _FP8_KV_OPERAND_DTYPES)
    _descales((("cache.k_descale", k_descale), ("cache.v_descale", v_descale)), k_cache,
              "an fp8 cache", "the cache", 2, "(batch, heads_kv) fp32 descales")
    if (k_token_descale is None) != (v_token_descale is None):
        invalid("cache.k_token_descale and cache.v_token_descale come together: "
                f"cache.{'v' if v_token_descale is None else 'k'}_token_descale is missing")
    _descales((("cache.k_token_descale", k_token_descale),
               ("cache.v_token_descale", v_token_descale)), k_cache, "an fp8 cache", "the cache",
              3, "the cache's dims less its head dim, fp32 descales")
    head_dim(q.shape[-1], "head_dim (q.size(-1))")
    head_dim(v_cache.shape[-1], "head_dim_v (v_cache.size(-1))")
    _dtypes((("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
             ("block_table", block_table)), torch.int32, "int32")
    _dtypes((("lse", lse), ("alibi_slopes", alibi_slopes), ("sinks", sinks)), torch.float32,
            "f32")


def _states(v, name, many):
    if v.dim() != (4 if many else 3):
        invalid(f"{name} has rank {v.dim()} but must have rank {4 if many else 3}: "
                + ("(tokens, states, heads, head_dim)" if many else "(tokens, heads, head_dim)"))
    if v.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        unsupported(f"{name} has dtype {DTYPE_NAMES[v.dtype]}: merge_states takes f16, bf16 or "
                    f"f32")
    head_dim(v.shape[-1], f"head_dim ({name}.size(-1))")


def merge_states(v_a, lse_a, v_b, lse_b, out, out_lse):
    """kiln::merge_states's op for two states (kiln.ops.merge_states)."""
    _all_known((("v_a", v_a), ("lse_a", lse_a), ("v_b", v_b), ("lse_b", lse_b), ("out", out),
                ("out_lse", out_lse)))
    for name, t in (("v_a", v_a), ("v_b", v_b), ("out", out)):
        _states(t, name, False)
    for name, t in (("lse_a", lse_a), ("lse_b", lse_b), ("out_lse", out_lse)):
        _lse(t, name, 2, "(tokens, heads)")


def merge_states_many(v, lse, out, out_lse):
    """kiln::merge_states's op for many states (kiln.ops.merge_states_many)."""
    _all_known((("v", v), ("lse", lse), ("out", out), ("out_lse", out_lse)))
    _states(v, "v", True)
    _states(out, "out", False)
    _lse(lse, "lse", 3, "(tokens, states, heads)")
    _lse(out_lse, "out_lse", 2, "(tokens, heads)")
