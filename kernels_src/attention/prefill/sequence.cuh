// SPDX-License-Identifier: Apache-2.0
// One (batch, head) sequence of a prefill call: its lengths, where its rows start in q, out and
// lse, and its K and V rows (attention/core/kv_layout.cuh), hiding the padded-batch vs varlen
// layouts from the kernel; and the tiles of the grid.
#pragma once

#include "attention/core/kv_layout.cuh"
#include "attention/core/mask.cuh"
#include "kiln/params/attention.h"

namespace kiln::attention {

struct Sequence {
  int batch;
  int head;
  int head_kv;  // the kv head the query head reads
  int seqlen_q;
  int seqlen_k;
  long long q_offset;  // element offsets of row 0 of this (batch, head)
  long long out_offset;
  long long lse_offset;
};

template <bool Varlen>
__device__ __forceinline__ Sequence locate_sequence(const AttentionParams& p, int batch, int head) {
  Sequence s;
  s.batch = batch;
  s.head = head;
  s.head_kv = head / (p.heads / p.heads_kv);
  if constexpr (Varlen) {
    // The token dim plays the seq dim; the batch stride is unused.
    const long long q_start = p.maybe_cu_seqlens_q[batch];
    const long long k_start = p.kv.maybe_cu_seqlens_k[batch];
    s.seqlen_q = static_cast<int>(p.maybe_cu_seqlens_q[batch + 1] - q_start);
    s.seqlen_k = static_cast<int>(p.kv.maybe_cu_seqlens_k[batch + 1] - k_start);
    s.q_offset = q_start * p.q_seq_stride;
    s.out_offset = q_start * p.out_seq_stride;
    s.lse_offset = q_start;
  } else {
    s.seqlen_q = p.seqlen_q;
    s.seqlen_k = p.seqlen_k;
    s.q_offset = batch * p.q_batch_stride;
    s.out_offset = batch * p.out_batch_stride;
    s.lse_offset = batch * p.lse_batch_stride;
  }
  if (p.maybe_seqused_k != nullptr) s.seqlen_k = p.maybe_seqused_k[batch];
  s.q_offset += head * p.q_head_stride;
  s.out_offset += head * p.out_head_stride;
  s.lse_offset += head * p.lse_head_stride;
  return s;
}

// The K and V rows of a sequence's kv head, as the spec lays k and v out.
template <class Spec, class T>
__device__ __forceinline__ KVRows<tensor_mode(Spec::varlen), const T> sequence_kv(
    const AttentionParams& p, const Sequence& seq) {
  return kv_rows<tensor_mode(Spec::varlen), const T>(p.kv, seq.batch, seq.head_kv);
}

// The query rows [begin, end) of a sequence that a row block covers; empty (begin >= end) when
// the block lies past the sequence's end.
struct RowBlock {
  int begin;
  int end;
};

// One tile of a prefill grid: BlockM query rows of one (batch, head) sequence (row block
// m_block; empty when it lies past the sequence's end), their band, and the key blocks of BlockN
// keys they visit.
struct Tile {
  Sequence seq;
  RowBlock rows;
  Band band;
  KeyBlocks blocks;
};

template <class Spec, int BlockM, int BlockN>
__device__ __forceinline__ Tile make_tile(const AttentionParams& p, int batch, int head,
                                          int m_block) {
  Tile t;
  t.seq = locate_sequence<Spec::varlen>(p, batch, head);
  t.rows.begin = m_block * BlockM;
  t.rows.end = min(t.rows.begin + BlockM, t.seq.seqlen_q);
  t.band = make_band<Spec::band>(p.score, t.seq.seqlen_q, t.seq.seqlen_k);
  t.blocks = key_blocks(t.band, t.rows.begin, t.rows.end, BlockN);
  return t;
}

// This CTA's tile: row blocks along x, last-first (under a causal band the late ones have the
// most keys, and starting them first keeps the tail of the grid short), heads along y, batch
// along z.
template <class Spec, int BlockM, int BlockN>
__device__ __forceinline__ Tile cta_tile(const AttentionParams& p) {
  return make_tile<Spec, BlockM, BlockN>(p, static_cast<int>(blockIdx.z),
                                         static_cast<int>(blockIdx.y),
                                         static_cast<int>(gridDim.x - 1 - blockIdx.x));
}

}  // namespace kiln::attention
