// SPDX-License-Identifier: Apache-2.0
// The score model every attention family's Params hold (AttentionParams::score,
// DecodeParams::score): scale, band, softcap, ALiBi and sinks. Like every Params header, the host
// includes it and JIT compiles are handed it by this one name, "kiln/params/score.h", so Params
// headers that hold it include it the same way in both.
#pragma once

#include "kiln/params/function.h"

namespace kiln {

// A user variant's runtime inputs (kiln::Variant, kiln/variant.hpp): scalars and tensors that
// travel in the Params, so that changing one never recompiles. A tensor is its data pointer, and
// up to 4 extents (unused ones 1) and strides in elements (unused ones 0); its dtype is what the
// variant's code reads it as.
struct VariantTensor {
  const void* data;
  long long strides[4];
  int sizes[4];
};

struct VariantParams {
  float scalars[8];
  VariantTensor tensors[4];
};

// Index i of a dimension of `size` elements (size >= 1), clamped into [0, size - 1].
KILN_PARAMS_FN constexpr long long variant_index(long long i, int size) {
  return i < 0 ? 0 : i < size ? i : size - 1;
}

// Element (i0, i1, i2, i3) of a variant tensor, read as T. Each index is clamped into its
// dimension, so that no read leaves the tensor: the hooks see coordinates past the sequence in
// a tile's overhang (kiln/variant.hpp), and a tensor sized by the sequence is read there too.
template <class T>
KILN_PARAMS_FN T variant_load(const VariantTensor& t, long long i0, long long i1 = 0,
                              long long i2 = 0, long long i3 = 0) {
  return static_cast<const T*>(t.data)[variant_index(i0, t.sizes[0]) * t.strides[0] +
                                       variant_index(i1, t.sizes[1]) * t.strides[1] +
                                       variant_index(i2, t.sizes[2]) * t.strides[2] +
                                       variant_index(i3, t.sizes[3]) * t.strides[3]];
}

// Where one logit sits, as a variant's hook is given it: the sequence, the query head and the kv
// head it reads (GQA), the query's row in q and the key's index within the sequence (varlen:
// counted from the sequence's start; decode: keys from the cache's start), and the diagonal's
// offset: query row i sits at key position i + offset, offset seqlen_k - seqlen_q (bottom-right,
// as FlashAttention; in decode, the cached keys before the queries) or 0 with top_left, as the
// band and ALiBi take it.
struct VariantCoords {
  int batch;
  int head;
  int head_kv;
  int query;
  int key;
  int offset;
};

// Filled from ScoreOptions (kiln/score.hpp) by the host; kernels read it as is.
struct ScoreParams {
  float softmax_scale;  // multiplies q.k before softmax, usually 1/sqrt(head_dim)

  // The one mask model: query i attends key j when
  //   i + offset - window_left <= j <= i + offset + window_right,
  // with offset = seqlen_k - seqlen_q (bottom-right, FlashAttention's default) or 0 when
  // top_left is set. A window of -1 is unbounded; causal is (-1, 0). Only read by kernels whose
  // spec has band = true (the offset also places ALiBi).
  int window_left;
  int window_right;
  int top_left;  // 0 or 1

  // softcap > 0: logits become softcap * tanh(logits / softcap) (spec has_softcap).
  float softcap;

  // fp32 slopes: logit(i, j) -= slope * |i + offset - j|, slope at
  // maybe_alibi_slopes[b * alibi_batch_stride + h] (0 = one slope per head; spec has_alibi).
  const float* maybe_alibi_slopes;
  long long alibi_batch_stride;

  // fp32 attention sinks, one logit per query head at maybe_sinks[h] (null: none): each row's
  // softmax gains exp(sink) in its denominator and nothing in its output, and its LSE counts it,
  // as if a key of that logit and a zero value were attended (gpt-oss, StreamingLLM). The sink
  // is in the logits' units (after scale, softcap and ALiBi), and no mask removes it.
  const float* maybe_sinks;

  // The inputs of the call's user variant (spec has_variant); zero without one.
  VariantParams variant;
};

}  // namespace kiln
