// SPDX-License-Identifier: Apache-2.0
// Where the backward's own tensors lie for one (batch, head) sequence: dout and dq, laid out like
// out and q with strides of their own, and dk and dv (AttentionBackwardParams::grads) like k and
// v; the dense fp32 gradient of the bias the dk/dv kernels write; and the gradient of a probability
// back to its q.k score.
#pragma once

#include "attention/core/kv_layout.cuh"
#include "attention/core/math.cuh"
#include "attention/prefill/sequence.cuh"
#include "kiln/params/attention_backward.h"

namespace kiln::attention {

// The element offset of row 0 of (batch, head) in a tensor laid out like q: (batch, seqlen,
// heads, dim), or varlen (tokens, heads, dim) from cu_seqlens_q[batch] on.
template <bool Varlen>
__device__ __forceinline__ long long query_rows_offset(const AttentionParams& p, int batch,
                                                       int head, long long batch_stride,
                                                       long long seq_stride,
                                                       long long head_stride) {
  const long long start = Varlen ? p.maybe_cu_seqlens_q[batch] * seq_stride
                                 : static_cast<long long>(batch) * batch_stride;
  return start + head * head_stride;
}

template <bool Varlen>
__device__ __forceinline__ long long dout_offset(const AttentionBackwardParams& bp, int batch,
                                                 int head) {
  return query_rows_offset<Varlen>(bp.fwd, batch, head, bp.dout_batch_stride, bp.dout_seq_stride,
                                   bp.dout_head_stride);
}

template <bool Varlen>
__device__ __forceinline__ long long dq_offset(const AttentionBackwardParams& bp, int batch,
                                               int head) {
  return query_rows_offset<Varlen>(bp.fwd, batch, head, bp.dq_batch_stride, bp.dq_seq_stride,
                                   bp.dq_head_stride);
}

// The keys k holds for sequence `batch` (all of which get dk and dv), and their dk and dv rows
// at kv head `head_kv`.
template <bool Varlen>
__device__ __forceinline__ int stored_keys(const AttentionParams& p, int batch) {
  return Varlen ? p.kv.maybe_cu_seqlens_k[batch + 1] - p.kv.maybe_cu_seqlens_k[batch] : p.seqlen_k;
}

template <bool Varlen, class T>
__device__ __forceinline__ KVRows<tensor_mode(Varlen), T> grad_rows(
    const AttentionBackwardParams& bp, int batch, int head_kv) {
  KVLayout grads = bp.grads;
  grads.maybe_cu_seqlens_k = bp.fwd.kv.maybe_cu_seqlens_k;
  return kv_rows<tensor_mode(Varlen), T>(grads, batch, head_kv);
}

// One dk/dv CTA's block of keys: BlockN keys from key0 of sequence `batch` at kv head head_kv
// (grid (key blocks, kv heads, batch)), the query heads of its group, whose lengths and band are
// the same, and the query rows that attend some of its keys (none past seqused_k; begin >= end
// when none does). key0 >= stored: the block holds no key of the sequence, and nothing to write.
struct KeyBlockTile {
  int batch, head_kv, key0, stored;
  int first_head, heads;  // the group's query heads
  Sequence first;         // of first_head
  Band band;
  RowBlock rows;
};

template <class Spec, int BlockN>
__device__ __forceinline__ KeyBlockTile key_block_tile(const AttentionParams& p) {
  KeyBlockTile t;
  t.batch = static_cast<int>(blockIdx.z);
  t.head_kv = static_cast<int>(blockIdx.y);
  t.key0 = static_cast<int>(blockIdx.x) * BlockN;
  t.stored = stored_keys<Spec::varlen>(p, t.batch);
  t.heads = p.heads / p.heads_kv;
  t.first_head = t.head_kv * t.heads;
  t.first = locate_sequence<Spec::varlen>(p, t.batch, t.first_head);
  t.band = make_band<Spec::band>(p.score, t.first.seqlen_q, t.first.seqlen_k);
  const int last_key = min(t.key0 + BlockN, t.first.seqlen_k) - 1;
  t.rows.begin = t.band.first_query(t.key0);
  t.rows.end = last_key < t.key0 ? 0 : t.band.last_query(last_key, t.first.seqlen_q) + 1;
  return t;
}

// Row 0 of (batch, head) in bp.maybe_dbias_accum, whose rows hold fwd.seqlen_k keys each (a
// bias comes with batched calls only, so every sequence has fwd.seqlen_q rows).
__device__ __forceinline__ float* dbias_accum_rows(const AttentionBackwardParams& bp, int batch,
                                                   int head) {
  const AttentionParams& p = bp.fwd;
  return bp.maybe_dbias_accum +
         (static_cast<long long>(batch) * p.heads + head) * p.seqlen_q * p.seqlen_k;
}

// exp(logit - lse) as the forward normalized it, from a logit in the transform's units (times
// to_log2 it is in log2 units) and the row's LSE in log2 units; 0 for a masked logit, and for
// a row that attended nothing (its LSE -inf).
__device__ __forceinline__ float probability(float logit, float to_log2, float lse_log2) {
  return lse_log2 == neg_inf() ? 0.f : exp2f(fmaf(logit, to_log2, -lse_log2));
}

}  // namespace kiln::attention
