// SPDX-License-Identifier: Apache-2.0
// Params of the decode family (append, split-KV attention, merge): public (a Kernel of the
// family launches with them), compiled into the host library and injected into each JIT compile
// as "kiln/params/decode.h".
#pragma once

#include "kiln/params/function.h"
#include "kiln/params/kv_layout.h"
#include "kiln/params/score.h"

namespace kiln {

// The argument of decode_append and attention_decode (kernels_src/attention/decode/). Layouts
// follow FlashAttention's kvcache call: q (batch, seqlen_q, heads, head_dim), out like q with
// head_dim_v; the cache is contiguous (batch_cache, seqlen_cache, heads_kv, dim) or paged
// (num_pages, page_size, heads_kv, dim). Strides in elements, last dims contiguous, 16-byte
// aligned rows (q, cache, out: strides multiples of 16 bytes, 8 elements of f16 or bf16).
struct DecodeParams {
  const void* q;  // attention_decode reads q here (the rotated copy when rotary is on)
  void* out;
  // The cache, written by decode_append: indexed (contiguous, sequence b in row
  // kv.maybe_batch_idx[b]), or paged (spec paged).
  KVLayout kv;

  long long q_batch_stride, q_seq_stride, q_head_stride;
  long long out_batch_stride, out_seq_stride, out_head_stride;

  // int32 on the device: keys cached per sequence before the append (batch entries).
  const int* seqlens;

  // NOTE: the pairs (heads, heads_kv) and (seqlen_q, seqlen_new) start 8-byte aligned, so that
  // the kernels load each pair at once: moving them changes the machine code.
  int heads;
  int heads_kv;  // divides heads; query head h reads kv head h / (heads / heads_kv)
  int seqlen_q;
  int seqlen_new;  // appended keys per sequence: sequence b attends seqlens[b] + seqlen_new keys
  int batch;

  // Scale, band, softcap and ALiBi (attention_decode). Sequence b's band has its offset from
  // seqlen_k = seqlens[b] + seqlen_new keys.
  ScoreParams score;

  // fp32 LSE, element (b, h, i) at b * lse_batch_stride + h * lse_head_stride + i. Null: none.
  float* maybe_lse;
  long long lse_batch_stride, lse_head_stride;

  // Split-KV. With num_splits > 1 each CTA of attention_decode writes an fp32 partial state,
  // partial_out[split][b][i][h][0, head_dim_v) and partial_lse[split][b][i][h] (natural log;
  // -inf for a split with no keys), contiguous, then sets its flag in split_flags[row block]
  // [split], row blocks numbered (b * heads_kv + kv head) * row_blocks + row block, to
  // split_tag; a split that finds all flags of its row block set merges the states into out and
  // lse. The flags are 0 before the call (memory kept zero for the stream, or zeroed for the
  // call) and the call leaves them 0; a flag counts as set only with split_tag, 1 to 2^48 - 2
  // and fresh per call.
  int num_splits;
  float* partial_out;
  float* partial_lse;
  unsigned long long* split_flags;
  unsigned long long split_tag;

  // decode_append only. k_new (batch, seqlen_new, heads_kv, head_dim), v_new likewise with
  // head_dim_v, written into the cache at positions seqlens[b] + t.
  const void* maybe_k_new;
  const void* maybe_v_new;
  long long k_new_batch_stride, k_new_seq_stride, k_new_head_stride;
  long long v_new_batch_stride, v_new_seq_stride, v_new_head_stride;
  // Rotary (spec rotary): cos/sin (seqlen_ro, rotary_dim / 2) in q's dtype, row stride
  // rotary_stride. k_new token t is rotated at position seqlens[b] + t, q token i at
  // seqlens[b] + (rotary_q_causal ? i : 0); the rotated q is written to q_rotated, contiguous
  // (batch, seqlen_q, heads, head_dim).
  const void* maybe_rotary_cos;
  const void* maybe_rotary_sin;
  long long rotary_stride;
  int rotary_dim;
  int rotary_interleaved;  // 1: pairs (2i, 2i + 1); 0: pairs (i, i + rotary_dim / 2)
  int rotary_q_causal;
  void* maybe_q_rotated;

  // An fp8 cache's descales (dtype_kv e4m3 or e5m2).
  KVDescales descales;
  // An fp8 cache's descales per (token, kv head) (spec token_descales): fp32 laid out as the
  // cache with no head dim, each key's and value's at the place the cache's row of it has, with
  // these strides in the batch (page), seq and head fields: the key attended is the cached one
  // times descales' and this (k), and likewise v. Its batch_idx, block table and page
  // size are kv's. decode_append writes those of the keys it appends.
  KVLayout token_descale;
};

// One input of the merge kernel: `states` attention states per (b, i, h) row, state s of row
// (b, i, h) at v + s * v_state_stride + b * v_batch_stride + i * v_seq_stride + h *
// v_head_stride (head_dim contiguous elements), its fp32 natural-log LSE likewise in lse.
struct MergeSource {
  const void* v;
  const float* lse;
  long long v_state_stride, v_batch_stride, v_seq_stride, v_head_stride;
  long long lse_state_stride, lse_batch_stride, lse_seq_stride, lse_head_stride;
  int states;
};

// The argument of merge_states_kernel (kernels_src/attention/decode/merge.cuh): merges every state
// of every source per row into out (and out_lse when set). Rows are (batch, seqlen, heads).
struct MergeParams {
  MergeSource source[2];
  int sources;  // 1 or 2

  void* out;
  long long out_batch_stride, out_seq_stride, out_head_stride;
  float* maybe_out_lse;
  long long out_lse_batch_stride, out_lse_seq_stride, out_lse_head_stride;

  int batch;
  int seqlen;
  int heads;
};

// Threads per CTA of decode_append and of merge_states_kernel: their __launch_bounds__ and their
// launches. merge_states_kernel's warps take every (kMergeThreads / 32)th state.
constexpr int kDecodeAppendThreads = 128;
constexpr int kMergeThreads = 128;

// Dynamic shared memory of attention_decode, in bytes; host and kernel share it. Per warp,
// `stages` slots of (K tile, V tile) of block_n rows of round_up(dim, 16) elements (swizzled,
// unpadded) of kv_size bytes each, and with token_descales the tile's block_n key and block_n
// value descales (fp32); plus the Q tile (16 * m_tiles rows, elements of q_size bytes) shared by
// the warps. q_size and kv_size come from the spec's dtype_q and dtype_kv. The end of the kernel
// reuses it to merge the warps' fp32 states: per warp, (16 * m_tiles) rows of
// round_up(head_dim_v, 16) + 8 outputs, and a max and a sum per row.
KILN_PARAMS_FN constexpr long long attention_decode_smem_bytes(
    long long head_dim, long long head_dim_v, long long m_tiles, long long block_n, long long warps,
    long long stages, long long q_size, long long kv_size, bool token_descales) {
  const long long qk_pitch = (head_dim + 15) / 16 * 16;
  const long long v_pitch = (head_dim_v + 15) / 16 * 16;
  const long long rows = 16 * m_tiles;
  const long long slot =
      kv_size * block_n * (qk_pitch + v_pitch) + (token_descales ? 8 : 0) * block_n;
  const long long tiles = q_size * rows * qk_pitch + warps * stages * slot;
  const long long merge = 4 * warps * rows * ((head_dim_v + 15) / 16 * 16 + 8 + 2);
  return tiles > merge ? tiles : merge;
}

}  // namespace kiln
