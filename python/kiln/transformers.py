# SPDX-License-Identifier: Apache-2.0
"""Hugging Face transformers integration: after kiln.transformers.register(),
`AutoModelForCausalLM.from_pretrained(..., attn_implementation="kiln")` runs attention on kiln.

    import kiln.transformers
    kiln.transformers.register()
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="kiln")

What reaches kiln, and how:
- Layouts: transformers hands attention q (batch, heads, seqlen, d) and k, v (batch, heads_kv,
  seqlen_k, d), its cache's own tensors. kiln takes FlashAttention's (batch, seqlen, heads, d)
  with any strides, so q, k and v go in as transpose views (no copy), k and v unrepeated (GQA and
  MQA run as such), and kiln's output (batch, seqlen, heads, d) is the layout transformers
  expects back.
- Masks: the usual causal mask, with a layer's sliding window (transformers' `sliding_window=w`
  means the last w keys, FlashAttention's window_size=(w - 1, w - 1) with causal, which is what
  kiln is given), runs as kiln's band: no mask tensor at all. Anything else (padding, a static
  cache's unused slots, packed sequences, a custom or 4D mask) comes as transformers' mask,
  made once per forward by the mask function registered below as an additive bias (0 or -inf,
  in the model's dtype, broadcast over heads with stride 0), which every kiln kernel takes. Why a
  bias and not varlen (cu_seqlens): varlen needs q, k and v packed token by token, a gather (a
  copy) of the whole KV cache at every decode step, and cannot express the left padding that
  batched generation uses without that gather; the bias keeps every tensor where transformers
  put it and covers every mask transformers can build. Its cost is one read of b x seqlen_q x
  seqlen_k bias elements (seqlen_q = 1 when decoding) and no skipping of masked blocks.
- Decode steps (one query per sequence) with no mask go to kiln's decode kernel
  (flash_attn_with_kvcache over transformers' cache tensors, nothing appended: transformers
  has already updated its cache); everything else to flash_attn_func.
- softcap and the softmax scale pass through as FlashAttention's softcap and softmax_scale.
- Attention sinks (gpt-oss's `s_aux`, a learned logit per head) pass through as kiln's sinks,
  in float32 (a differentiable cast when they are trained, so that their gradient reaches the
  parameter).
- Training: kiln's calls are differentiable in q, k, v and the sinks, so model.train() with
  gradients trains; a step that needs gradients runs flash_attn_func even for one query (the
  decode kernel has no backward). kiln has no dropout: dropout > 0 raises.
"""

import math
import weakref

import torch

import kiln as _kiln
from kiln import _capi
from kiln import ops as _ops

NAME = "kiln"


def register(name=NAME):
    """Registers kiln as `attn_implementation=name` (default "kiln") in transformers: the
    attention function and the mask function that makes its masks."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # transformers before 4.53 builds 4D float masks itself: bias as is
        return
    AttentionMaskInterface.register(name, make_mask)


def _band_suffices(
    q_length=None,
    kv_length=None,
    q_offset=0,
    kv_offset=0,
    attention_mask=None,
    local_size=None,
    allow_is_causal_skip=False,
    allow_is_bidirectional_skip=False,
    config=None,
    **_,
):
    """Whether the mask transformers asks for is exactly kiln's band (causal or full, with the
    layer's sliding window) so that no mask is needed: no custom mask functions or packed
    sequences (transformers then allows a skip), no padding among the keys, and the last query
    at the last key's position (bottom-right alignment, which a static cache's spare slots
    break)."""
    if q_length is None:  # transformers before 5: the mask's sizes come another way
        return False
    if allow_is_causal_skip:
        # local_size is the sliding window the layer also passes as sliding_window, unless it is
        # a chunk size (chunked attention is no band).
        if local_size is not None and (
            local_size != getattr(config, "sliding_window", None)
            or local_size == getattr(config, "attention_chunk_size", None)
        ):
            return False
    elif not allow_is_bidirectional_skip or local_size is not None:
        return False
    if isinstance(q_offset, torch.Tensor) or q_offset + q_length != kv_offset + kv_length:
        return False
    if attention_mask is None:
        return True
    if torch.compiler.is_compiling():  # reading the mask would break the graph
        return False
    keys = attention_mask[:, kv_offset : kv_offset + kv_length]
    return keys.shape[-1] == kv_length and bool(keys.all())


def make_mask(*args, **kwargs):
    """transformers' mask function for kiln (AttentionMaskInterface): None where kiln's band
    suffices, else the boolean mask transformers builds for SDPA as an additive bias (0 where
    attended, -inf where not) of shape (batch, 1, seqlen_q, seqlen_k) in the model's dtype."""
    from transformers.masking_utils import sdpa_mask

    if not args and _band_suffices(**kwargs):
        return None
    dtype = kwargs.pop("dtype", torch.float32)
    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    mask = sdpa_mask(*args, **kwargs)
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -math.inf)


def _bias(mask, query, key):
    """transformers' attention_mask as kiln's bias (batch, heads, seqlen_q, seqlen_k) in q's
    dtype: additive masks as they are, boolean ones (a caller's 4D mask) as 0 / -inf."""
    batch, heads, seqlen_q, _ = query.shape
    mask = mask[:, :, :, : key.shape[2]]  # a static cache's mask may be longer than its keys
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=query.dtype, device=mask.device).masked_fill_(
            ~mask, -math.inf
        )
    return mask.to(query.dtype).expand(batch, heads, seqlen_q, key.shape[2])


# Each model's sinks parameter as float32, made once per parameter and value: a cast per layer
# and step would cost a kernel launch each time (gpt-oss keeps its sinks in the model's dtype).
# Keyed by id (a tensor's == is elementwise), each entry holding a weak reference to its
# parameter, whose death drops the entry.
_float_sinks_cache = {}


def _float_sinks(sinks):
    """`sinks` (s_aux) as the contiguous float32 (heads) tensor kiln takes: a differentiable
    cast when a step trains them, else without its grad, cast once per value."""
    if sinks.requires_grad and torch.is_grad_enabled():
        return sinks.float().contiguous()
    if sinks.dtype == torch.float32 and sinks.is_contiguous():
        return sinks.detach()
    if _ops._is_compiling():  # a traced graph fuses the cast; no Python cache there
        return sinks.detach().float().contiguous()
    # The parameter itself is the key (a detached view is a new object each call), stamped with
    # what an in-place update, a new storage or a move would change.
    key = id(sinks)
    stamp = (sinks._version, sinks.data_ptr(), sinks.device)
    cached = _float_sinks_cache.get(key)
    if cached is None or cached[0]() is not sinks or cached[1] != stamp:
        owner = weakref.ref(sinks, lambda _: _float_sinks_cache.pop(key, None))
        cached = (owner, stamp, sinks.detach().float().contiguous())
        _float_sinks_cache[key] = cached
    return cached[2]


def _no_dropout(module, dropout):
    """Refuses what kiln cannot do: dropout."""
    if dropout > 0:
        raise _kiln.KilnNotImplementedError(
            _capi.KILN_ERROR_UNSUPPORTED,
            f"attn_implementation='kiln' has no dropout, and {type(module).__name__} asks for "
            f"dropout={dropout} (in training mode: {module.training}): set the attention "
            f"dropout to 0 (for inference, model.eval() does), or load the model with "
            f"attn_implementation='sdpa' to train it with dropout",
        )


def attention_forward(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout=0.0,
    scaling=None,
    sliding_window=None,
    softcap=None,
    is_causal=None,
    **kwargs,
):
    """transformers' attention function contract: query (batch, heads, seqlen_q, d), key and
    value (batch, heads_kv, seqlen_k, d), attention_mask None or (batch or 1, 1, seqlen_q,
    >= seqlen_k). Returns (output (batch, seqlen_q, heads, d), None): kiln never forms the
    attention weights."""
    _no_dropout(module, dropout)
    q = query.transpose(1, 2)  # views: (batch, seqlen, heads, d)
    k = key.transpose(1, 2)
    v = value.transpose(1, 2)
    sinks = kwargs.get("s_aux")
    score = dict(
        softmax_scale=scaling,
        softcap=softcap or 0.0,
        sinks=None if sinks is None else _float_sinks(sinks),
    )
    if attention_mask is not None:
        out = _kiln.flash_attn_func(q, k, v, bias=_bias(attention_mask, query, key), **score)
        return out, None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (sliding_window - 1, sliding_window - 1) if sliding_window else (-1, -1)
    trains = torch.is_grad_enabled() and _ops.needs_grad((q, k, v, score["sinks"]))
    if q.shape[1] == 1 and not trains:
        out = _kiln.flash_attn_with_kvcache(q, k, v, causal=causal, window_size=window, **score)
    else:
        out = _kiln.flash_attn_func(q, k, v, causal=causal, window_size=window, **score)
    return out, None
