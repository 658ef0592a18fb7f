// SPDX-License-Identifier: Apache-2.0
// Params of the attention backward kernels (kernels_src/attention/backward): public, compiled
// into the host library and injected into each JIT compile as "kiln/params/attention_backward.h",
// so host and kernel always agree on the layout.
#pragma once

#include "kiln/params/attention.h"
#include "kiln/params/kv_layout.h"

namespace kiln {

// The only argument of every backward kernel. fwd is the forward call's params as
// kiln::attention() made them (q, k and v, out, the score, bias, varlen), with fwd.maybe_lse the
// forward's LSE, which the backward reads. dout has out's layout, dq q's; grads holds dk and dv
// in k's and v's layout (its k and v; block table and batch index unused). Strides in elements,
// 16-byte aligned, as the forward's. Every key k holds gets its dk and dv, zero for keys that no
// query attends (those past seqused_k among them): batched, fwd.seqlen_k keys a sequence; varlen,
// [cu_seqlens_k[b], cu_seqlens_k[b + 1]).
struct AttentionBackwardParams {
  AttentionParams fwd;
  const void* dout;
  long long dout_batch_stride, dout_seq_stride, dout_head_stride;
  void* dq;
  long long dq_batch_stride, dq_seq_stride, dq_head_stride;
  KVLayout grads;

  // Scratch, fp32: D = rowsum(dO * O) of each query row, at the LSE's offsets (fwd.maybe_lse's
  // strides), written by attention_backward_dot before the other kernels read it.
  float* row_dot;
  // The sinks' gradient (fwd.score.maybe_sinks set): attention_backward_dot writes one partial
  // sum per (head, batch, row block of dot_block_m rows) to maybe_sink_partials, at
  // (head * batch + b) * dot_row_blocks + block, which attention_backward_sinks adds up, in
  // order, into maybe_dsinks (fp32, heads). Null: not asked.
  float* maybe_sink_partials;
  float* maybe_dsinks;
  int dot_row_blocks;
  // The wgmma kernels' dq accumulators, fp32, zeroed before attention_backward_dkdv_wgmma adds
  // each key block's share with atomic reductions: head_dim floats a query row, the row at its LSE
  // offset (row r of (batch, head) at (lse offset + r) * head_dim), its 16-byte pieces rotated
  // (backward_wgmma.cuh). Null for the other kernels.
  float* maybe_dq_accum;
  // With deterministic, the order of those additions: one int a (batch, head, block of block_m
  // query rows), at (batch * heads + head) * dq_row_blocks + block, zeroed before the dk/dv
  // kernel, counting the key blocks that have added to the rows; each adds in its turn, in the
  // order of its blockIdx.x. Null otherwise.
  int* maybe_dq_semaphore;
  int dq_row_blocks;
  // The bias's gradient (fwd.maybe_bias set; the dk/dv kernel compiled with has_dbias, else
  // null): the dk/dv kernel writes dL / d logit of each (batch, head, query row, key) it
  // visits to maybe_dbias_accum (fp32, dense (batch, heads, seqlen_q, seqlen_k), zeroed before
  // it: the pairs it skips, outside the band, stay 0); attention_backward_dbias then sums that
  // over the dims that dbias has size 1 in (dbias_batch or dbias_heads 1 where there are more),
  // in a fixed order, into maybe_dbias (the bias's dtype, at the dbias_*_stride strides).
  float* maybe_dbias_accum;
  void* maybe_dbias;
  long long dbias_batch_stride, dbias_head_stride, dbias_row_stride, dbias_col_stride;
  int dbias_batch, dbias_heads;
  // The wgmma dk/dv kernel's TMA descriptors of q and dout, as attention_forward_tma's
  // (AttentionTmaParams) with boxes of 64 columns by block_m rows; unused by the others.
  TensorMap q_map;
  TensorMap dout_map;
};

// Query rows per CTA of attention_backward_dot, and its threads: 4 lanes a row.
constexpr int kAttentionBackwardDotRows = 64;
constexpr int kAttentionBackwardDotThreads = 256;
// Threads of attention_backward_sinks, whose grid is one CTA per head.
constexpr int kAttentionBackwardSinksThreads = 256;
// Threads of attention_backward_dbias, one element of dbias each.
constexpr int kAttentionBackwardDbiasThreads = 256;

// Dynamic shared memory of attention_backward_dkdv_portable, in bytes: a tile of block_m query
// rows and one of their output gradients, unpadded, then each row's LSE and D (fp32).
KILN_PARAMS_FN constexpr long long attention_backward_dkdv_portable_smem_bytes(long long head_dim,
                                                                               long long head_dim_v,
                                                                               long long block_m,
                                                                               long long q_size,
                                                                               long long out_size) {
  return block_m * (head_dim * q_size + head_dim_v * out_size) + 2 * block_m * 4;
}

// Dynamic shared memory of attention_backward_dkdv_mma (row_floats 2: each streamed row's LSE
// and D) and attention_backward_dq_mma (row_floats 0), in bytes: the block_n rows a CTA holds
// (k and v; q and dout) and two slots of block_m streamed rows (q and dout; k and v) with their
// row_floats fp32 values. Rows padded as the forward's (attention_forward_smem_bytes), each head
// dim to 16 for each of the split = warps / (block_n / 16) warps that share a row group:
//   qk_pitch = round_up(head_dim, 16 split) + 8, v_pitch = round_up(head_dim_v, 16 split) + 8
//   bytes = size (block_n + 2 block_m) (qk_pitch + v_pitch) + 2 block_m row_floats 4
KILN_PARAMS_FN constexpr long long attention_backward_mma_smem_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n, long long warps,
    long long size, long long row_floats) {
  const long long groups = block_n / 16;
  const long long multiple = 16 * (groups >= 1 && warps > groups ? warps / groups : 1);
  const long long qk_pitch = (head_dim + multiple - 1) / multiple * multiple + 8;
  const long long v_pitch = (head_dim_v + multiple - 1) / multiple * multiple + 8;
  return size * (block_n + 2 * block_m) * (qk_pitch + v_pitch) + 2 * block_m * row_floats * 4;
}

// The CTAs of attention_backward_dkdv_wgmma an SM runs at once (its launch bounds' minimum), and
// so the registers each of its threads is launched with: two with one consumer warpgroup (warps
// 4), so that one's products run under the other's softmax work; one with more.
KILN_PARAMS_FN constexpr int attention_backward_wgmma_ctas_per_sm(long long warps) {
  return warps == 4 ? 2 : 1;
}

// The fewest registers a thread a build of attention_backward_dkdv_wgmma must have for its
// warpgroups' register split (setmaxnreg), which claims all that its launch gives them: 65536 a
// CTA, attention_backward_wgmma_ctas_per_sm CTAs an SM, over warps * 32 + 128 threads, in 8s.
KILN_PARAMS_FN constexpr int attention_backward_wgmma_least_registers(long long warps) {
  return static_cast<int>(65536 / attention_backward_wgmma_ctas_per_sm(warps) / (warps * 32 + 128) /
                          8 * 8);
}

// The attention_backward_dkdv_wgmma kernel's consumer warpgroups split the keys, a warpgroup per
// 64 (warps = block_n / 16), or with warps 8 over block_n 64, two of them split the head dims:
// its column groups, 1 or 2.
KILN_PARAMS_FN constexpr long long attention_backward_wgmma_column_groups(long long block_n,
                                                                          long long warps) {
  return warps * 16 > block_n ? 2 : 1;
}

// A head dim as that kernel pads it with zeros: to a multiple of 64 (the swizzle width) for each
// column group.
KILN_PARAMS_FN constexpr long long attention_backward_wgmma_padded_dim(long long head_dim,
                                                                       long long block_n,
                                                                       long long warps) {
  const long long align = 64 * attention_backward_wgmma_column_groups(block_n, warps);
  return (head_dim + align - 1) / align * align;
}

// dQ's columns each of its warpgroups computes: the padded head dim's block_m / 64 row tiles
// shared among warps / 4 warpgroups, each taking 64 rows and a multiple of 64 columns.
KILN_PARAMS_FN constexpr long long attention_backward_wgmma_dq_cols(long long head_dim,
                                                                    long long block_m,
                                                                    long long block_n,
                                                                    long long warps) {
  return attention_backward_wgmma_padded_dim(head_dim, block_n, warps) * (block_m / 64) /
         (warps / 4);
}

// Whether that kernel adds dQ through the fp32 staging block by bulk reductions (which take
// their turns with deterministic), or straight from the consumers' registers with vector
// reductions: where the head dims are split and the order is free, so that the staging block's
// memory holds a second slot.
KILN_PARAMS_FN constexpr bool attention_backward_wgmma_staged_dq(long long block_n, long long warps,
                                                                 bool deterministic) {
  return deterministic || attention_backward_wgmma_column_groups(block_n, warps) == 1;
}

// Its slots: two (the next block's rows land while one is read), but one where the head dims are
// split and dQ is staged (at 256 two would need 291 KB).
KILN_PARAMS_FN constexpr long long attention_backward_wgmma_stages(long long block_n,
                                                                   long long warps,
                                                                   bool deterministic) {
  return attention_backward_wgmma_staged_dq(block_n, warps, deterministic) &&
                 attention_backward_wgmma_column_groups(block_n, warps) == 2
             ? 1
             : 2;
}

// Its dynamic shared memory, in bytes: 1024 for alignment, the K and V tiles of block_n keys, two
// dS^T tiles (block_n x block_m; where the head dims are split, two P^T tiles too), then where dQ
// is staged the fp32 staging block (block_m x head_dim, rounded up to 1024) and the slots of
// block_m query rows (Q, dO, and each row's LSE and D in fp32, the slot rounded up to 1024); where
// it is not, the slots of Q and dO alone, then all the slots' LSE and D (rounded up to 1024), so
// that two slots fit at 256. 2-byte operands, head dims padded:
//   qk, v = the padded head_dim, head_dim_v; groups = attention_backward_wgmma_column_groups;
//   stages = attention_backward_wgmma_stages
//   staged: bytes = 1024 + 2 block_n (qk + v + 2 groups block_m) + round_up(4 block_m head_dim,
//                   1024) + stages round_up(2 block_m (qk + v) + 8 block_m, 1024)
//   not:    bytes = 1024 + 2 block_n (qk + v + 2 groups block_m) + stages 2 block_m (qk + v)
//                   + round_up(stages 8 block_m, 1024)
KILN_PARAMS_FN constexpr long long attention_backward_wgmma_smem_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n, long long warps,
    bool deterministic) {
  const long long qk = attention_backward_wgmma_padded_dim(head_dim, block_n, warps);
  const long long v = attention_backward_wgmma_padded_dim(head_dim_v, block_n, warps);
  const long long stages = attention_backward_wgmma_stages(block_n, warps, deterministic);
  const long long groups = attention_backward_wgmma_column_groups(block_n, warps);
  const long long tiles = 1024 + 2 * block_n * (qk + v + 2 * groups * block_m);
  if (!attention_backward_wgmma_staged_dq(block_n, warps, deterministic)) {
    return tiles + stages * 2 * block_m * (qk + v) + (stages * 8 * block_m + 1023) / 1024 * 1024;
  }
  return tiles + (4 * block_m * head_dim + 1023) / 1024 * 1024 +
         stages * ((2 * block_m * (qk + v) + 8 * block_m + 1023) / 1024 * 1024);
}

}  // namespace kiln
