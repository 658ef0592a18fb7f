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

// The query rows of a sequence (seqlen_q x seqlen_k under `band`) that attend some key of the
// BlockN keys from key0: begin >= end when none does.
template <int BlockN>
__device__ __forceinline__ RowBlock key_block_rows(const Band& band, int key0, int seqlen_q,
                                                   int seqlen_k) {
  const int last_key = min(key0 + BlockN, seqlen_k) - 1;
  return {band.first_query(key0), last_key < key0 ? 0 : band.last_query(last_key, seqlen_q) + 1};
}

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
  t.rows = key_block_rows<BlockN>(t.band, t.key0, t.first.seqlen_q, t.first.seqlen_k);
  return t;
}

// A dk/dv CTA's steps: the rows that attend its key block (tile.rows), BlockM at a time from the
// first, for each query head of its group in turn; none when no row does. A step is its (head,
// first row). Ordered: the steps are the sequence's blocks of BlockM rows (from the multiple of
// BlockM at or before the first row), the last first, each for every head of the group in turn:
// the order in which deterministic dq's key blocks, taking turns at a block of rows by
// blockIdx.x, wait least under a causal band (backward_wgmma.cuh's add_in_turn). Heads inner:
// with them outer, a key block that has fewer row blocks a head than the one before it would
// reach the next head early and wait there for the rest of the previous head.
struct RowStep {
  int head, r0;
};

template <int BlockM, bool Ordered = false>
struct RowSteps {
  int row_begin, row_end, first_head, end_head;

  // The first row of the steps over `rows`.
  __device__ __forceinline__ static int first_row(const RowBlock& rows) {
    return Ordered ? rows.begin / BlockM * BlockM : rows.begin;
  }

  __device__ __forceinline__ explicit RowSteps(const KeyBlockTile& tile)
      : row_begin(first_row(tile.rows)),
        row_end(tile.rows.end),
        first_head(tile.first_head),
        end_head(tile.rows.begin < tile.rows.end ? tile.first_head + tile.heads : tile.first_head) {
  }

  __device__ __forceinline__ RowStep first() const {
    return {first_head, Ordered ? (row_end - 1) / BlockM * BlockM : row_begin};
  }
  __device__ __forceinline__ bool done(RowStep at) const { return at.head >= end_head; }
  __device__ __forceinline__ RowStep after(RowStep at) const {
    if constexpr (Ordered) {
      if (at.head + 1 < end_head) return {at.head + 1, at.r0};
      return at.r0 - BlockM >= row_begin ? RowStep{first_head, at.r0 - BlockM}
                                         : RowStep{end_head, at.r0};
    } else {
      return at.r0 + BlockM < row_end ? RowStep{at.head, at.r0 + BlockM}
                                      : RowStep{at.head + 1, row_begin};
    }
  }
};

// The LSE (in log2 units) and D of a step's query row `row` (of a sequence whose rows' LSE
// starts at lse_offset); -inf and 0 from row_end on, where the key block gets no probability.
struct RowValues {
  float lse, dot;
};

__device__ __forceinline__ RowValues row_values(const AttentionBackwardParams& bp,
                                                long long lse_offset, int row, int row_end) {
  if (row >= row_end) return {neg_inf(), 0.f};
  return {bp.fwd.maybe_lse[lse_offset + row] * kLog2e, bp.row_dot[lse_offset + row]};
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
