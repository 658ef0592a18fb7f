// SPDX-License-Identifier: Apache-2.0
// Params of the attention family: public (a Kernel of the family launches with them), compiled
// into the host library and injected into each JIT compile as "kiln/params/attention.h", so host
// and kernel always agree on the layout.
#pragma once

#include "kiln/params/function.h"
#include "kiln/params/kv_layout.h"
#include "kiln/params/score.h"

namespace kiln {

// The forward kernel's only argument. Layouts follow FlashAttention: q (batch, seqlen_q, heads,
// head_dim), k and v (batch, seqlen_k, heads_kv, head_dim / head_dim_v), out like q with
// head_dim_v; varlen folds batch and seqlen into one token dim indexed through cu_seqlens.
// Strides are in elements; the last dim is contiguous (stride 1) for every tensor except bias.
// q, k, v, out and every batch/seq/head stride of them must be 16-byte aligned (strides a
// multiple of 16 bytes, 8 elements of f16 or bf16): tiles move in 16-byte copies.
struct AttentionParams {
  const void* q;
  void* out;
  // k and v: batched, or varlen (spec varlen) through kv.maybe_cu_seqlens_k.
  KVLayout kv;
  // fp8 k and v's descales (attention_forward with dtype_kv e4m3 or e5m2).
  KVDescales descales;

  // Batch strides are ignored by varlen kernels (the token dim is the seq dim).
  long long q_batch_stride, q_seq_stride, q_head_stride;
  long long out_batch_stride, out_seq_stride, out_head_stride;

  int batch;
  int heads;     // query heads
  int heads_kv;  // divides heads: query head h reads kv head h / (heads / heads_kv)
  int seqlen_q;  // varlen: the longest sequence (sizes the grid)
  int seqlen_k;  // varlen: unused (lengths come from cu_seqlens_k or seqused_k)

  ScoreParams score;  // scale, band, softcap and ALiBi

  // Additive bias of q's dtype, element (b, h, i, j) at
  // b * bias_batch_stride + h * bias_head_stride + i * bias_row_stride + j * bias_col_stride;
  // a stride of 0 broadcasts (spec has_bias). Varlen: i and j count within the sequence.
  const void* maybe_bias;
  long long bias_batch_stride, bias_head_stride, bias_row_stride, bias_col_stride;

  // fp32 natural-log sum of exp of each query row, element (b, h, i) at
  // b * lse_batch_stride + h * lse_head_stride + i; varlen: at h * lse_head_stride +
  // cu_seqlens_q[b] + i (so (heads, total_q) has lse_head_stride = total_q). Null: not written.
  float* maybe_lse;
  long long lse_batch_stride, lse_head_stride;

  // Varlen (spec varlen): sequence b is tokens [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q/out
  // (and kv.maybe_cu_seqlens_k's of k/v); int32, batch + 1 entries, on the device.
  const int* maybe_cu_seqlens_q;
  // When set, sequence b uses only its first seqused_k[b] keys (varlen or not).
  const int* maybe_seqused_k;
};

// A TMA descriptor (CUtensorMap): 128 opaque bytes the driver writes on the host, which a kernel
// hands to cp.async.bulk.tensor from parameter space; 64-byte aligned, as the driver requires.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};

// The only argument of attention_forward_tma (sm_90a): the forward params and TMA descriptors of
// q, k and v, each 4-d (head_dim, tokens, heads, batch), innermost first, with 128-byte-swizzled
// boxes of 64 columns by block_m (q) or block_n (k, v) rows. Varlen puts every sequence in the
// token dim of one batch (tokens start at cu_seqlens); padded batches index the batch dim.
// The persistent grid's scheduling (neither changes results): maybe_tile_counter, two words that
// are zero at launch and that the kernel leaves zero (null: tiles are dealt round-robin), and
// section_pairs, how many (batch, head) pairs' tiles are taken together (at least 1).
// With fp8 q, k and v (dtype_q e4m3) the boxes are 128 columns (128 bytes) wide, q's and k's 64
// (64 bytes, swizzled by 64) at head dims to 64 (attention_forward_wgmma_chunk_bytes), and q's
// descale (FlashAttention-3's q_descale, fp32 (batch, heads_kv), a row per sequence with varlen;
// null: 1) joins k's in the softmax scale. Under a 16-bit q, fp8 k's and v's boxes are 64
// columns (64 bytes, swizzled by 64), but k's as the all-fp8 forward's where q is split (a bf16 q
// over e4m3 k and v: attention_forward_tma_widens_k below).
struct AttentionTmaParams {
  TensorMap q_map;
  TensorMap k_map;
  TensorMap v_map;
  AttentionParams p;
  unsigned* maybe_tile_counter;
  int section_pairs;
  const float* maybe_q_descale;
  long long q_descale_batch_stride, q_descale_head_stride;
};

// The shared-memory formulas below take the bytes of an element of each operand: q_size (q),
// kv_size (k and v) and out_size (out), from the spec's dtype_q, dtype_kv and dtype_out.

// Dynamic shared memory of attention_forward for a spec, in bytes; host and kernel share it.
// Rows are padded to the mma k-granularity (16) plus 8 elements so that ldmatrix and cp.async
// hit distinct banks; fp8 K and V tiles (kv_size 1) are swizzled instead, unpadded:
//   qk_pitch = round_up(head_dim, 16) + 8, v_pitch = round_up(head_dim_v, 16) + 8
//   kv_unpad = 8 for fp8 K and V (their rows drop the spare elements), else 0
//   bytes = max(q_size * block_m * qk_pitch
//                   + kv_size * stages * block_n * (qk_pitch + v_pitch - 2 * kv_unpad),
//               out_size * block_m * v_pitch)          (the second term: the output staging tile)
KILN_PARAMS_FN constexpr long long attention_forward_smem_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long kv_size, long long out_size) {
  const long long qk_pitch = (head_dim + 15) / 16 * 16 + 8;
  const long long v_pitch = (head_dim_v + 15) / 16 * 16 + 8;
  const long long kv_unpad = kv_size == 1 ? 8 : 0;
  const long long tiles = q_size * block_m * qk_pitch +
                          kv_size * stages * block_n * (qk_pitch + v_pitch - 2 * kv_unpad);
  const long long staging = out_size * block_m * v_pitch;
  return tiles > staging ? tiles : staging;
}

// The bytes of a row of a swizzle chunk of Q and K in attention_forward_wgmma and _tma, the
// swizzle's width, for Q K^T's operands of `size` bytes an element: 128, or with fp8 ones at head
// dims to 64, 64 (a 128-byte chunk would be half padding).
KILN_PARAMS_FN constexpr int attention_forward_wgmma_chunk_bytes(long long head_dim,
                                                                 long long size) {
  return size == 1 && head_dim <= 64 ? 64 : 128;
}

// The bytes of attention_forward_wgmma's Q tile and `stages` (K, V) slots, unpadded: head_dim
// rounded up to the swizzle's chunks (attention_forward_wgmma_chunk_bytes), head_dim_v to 64 (an
// fp8 q's above 128 to 128).
KILN_PARAMS_FN constexpr long long attention_forward_wgmma_tile_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long kv_size) {
  const long long chunk = attention_forward_wgmma_chunk_bytes(head_dim, q_size) / q_size;
  const long long qk_dim = (head_dim + chunk - 1) / chunk * chunk;
  const long long v_chunk = q_size == 1 && head_dim_v > 128 ? 128 : 64;
  const long long v_dim = (head_dim_v + v_chunk - 1) / v_chunk * v_chunk;
  return q_size * block_m * qk_dim + kv_size * stages * block_n * (qk_dim + v_dim);
}

// The bytes of the output staging tile of attention_forward_wgmma and _tma: block_m rows of
// head_dim_v rounded to 64, plus 8.
KILN_PARAMS_FN constexpr long long attention_forward_wgmma_staging_bytes(long long head_dim_v,
                                                                         long long block_m,
                                                                         long long out_size) {
  return out_size * block_m * ((head_dim_v + 63) / 64 * 64 + 8);
}

// Dynamic shared memory of attention_forward_wgmma (sm_90a), in bytes: 1024 bytes of slack to
// align the tiles for the 128-byte swizzle, then the tiles; the output staging tile reuses them.
KILN_PARAMS_FN constexpr long long attention_forward_wgmma_smem_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long kv_size, long long out_size) {
  const long long tiles = attention_forward_wgmma_tile_bytes(head_dim, head_dim_v, block_m, block_n,
                                                             stages, q_size, kv_size);
  const long long staging = attention_forward_wgmma_staging_bytes(head_dim_v, block_m, out_size);
  return 1024 + (tiles > staging ? tiles : staging);
}

// The tma kernel's dynamic shared memory at most: 227 KiB a CTA, less 1 KiB for its barriers in
// static shared memory.
KILN_PARAMS_FN constexpr long long attention_forward_tma_budget_bytes() {
  return 227 * 1024 - 1024;
}

// The tma kernel's register split (setmaxnreg), for block_m / 64 consumer warpgroups and the
// producer's, out of the 65536 a CTA has (one CTA an SM: 65536 / threads a thread, in 8s, which
// ptxas gives with two or three consumer warpgroups; with one, 240, below the 256 that would be
// and the most it builds); the producer warpgroup keeps 40 beside two consumer warpgroups (walking
// the tiles under a band it needs them; with 24 it spilled 68-92 bytes, while the consumers do
// not spill at the 232 left to them) and 32 otherwise (beside three, exactly what leaves each of
// them 160, which are tight; 24, the least there is, gave them no more, since counts go by 8, and
// left the producer spilling at the slightest change to its code). The consumers take the rest,
// at most 240 (multiples of 8).
KILN_PARAMS_FN constexpr int attention_forward_tma_producer_registers(long long block_m) {
  return block_m == 128 ? 40 : 32;
}
KILN_PARAMS_FN constexpr int attention_forward_tma_consumer_registers(long long block_m) {
  const long long threads = block_m * 2 + 128;
  const long long spare = (65536 / threads / 8 * 8 * threads -
                           attention_forward_tma_producer_registers(block_m) * 128) /
                          (block_m * 2) / 8 * 8;
  return static_cast<int>(spare < 240 ? spare : 240);
}

// The fewest registers a thread a build of the tma kernel must have for its split: what its
// warpgroups claim, over its threads, in 8s. With fewer, setmaxnreg.inc would wait forever for
// registers the CTA was never given.
KILN_PARAMS_FN constexpr int attention_forward_tma_least_registers(long long block_m) {
  const long long threads = block_m * 2 + 128;
  const long long claimed = attention_forward_tma_producer_registers(block_m) * 128LL +
                            attention_forward_tma_consumer_registers(block_m) * block_m * 2;
  return static_cast<int>((claimed + threads * 8 - 1) / (threads * 8) * 8);
}

// The tma kernel's operands in shared memory take three more sizes beside q_size, kv_size and
// out_size: qk_size, the bytes of an element of Q K^T's operands there. q_size, but 1 for a bf16 q
// over e4m3 k and v, whose Q K^T takes fp8 products: K lands in its slots as e4m3 and q, once
// landed, is split into two e4m3 terms in its place (its bits exactly where its values span less
// than 2^10), P V staying in q's type.
//
// qk_size for a q of q_size bytes, a bf16 one or not, over k and v that are e4m3 or not.
KILN_PARAMS_FN constexpr long long attention_forward_tma_qk_size(long long q_size, bool q_bf16,
                                                                 bool kv_e4m3) {
  return q_bf16 && kv_e4m3 ? 1 : q_size;
}

// Whether the tma kernel widens fp8 K to q's type (fp8 k and v under a 16-bit q, not split).
KILN_PARAMS_FN constexpr bool attention_forward_tma_widens_k(long long q_size, long long qk_size,
                                                             long long kv_size) {
  return kv_size == 1 && q_size == 2 && qk_size == 2;
}

// The bytes of the tma kernel's Q tile and `stages` (K, V) slots: attention_forward_wgmma's in
// q's type, but where q is split (qk_size below q_size) K's slots hold e4m3 (q's two terms take
// the bytes of its tile).
KILN_PARAMS_FN constexpr long long attention_forward_tma_tile_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long qk_size) {
  if (qk_size == q_size) {
    return attention_forward_wgmma_tile_bytes(head_dim, head_dim_v, block_m, block_n, stages,
                                              q_size, q_size);
  }
  const long long chunk = attention_forward_wgmma_chunk_bytes(head_dim, qk_size) / qk_size;
  const long long qk_dim = (head_dim + chunk - 1) / chunk * chunk;
  const long long q_dim = (head_dim + 63) / 64 * 64;
  const long long v_dim = (head_dim_v + 63) / 64 * 64;
  return block_m * q_dim * q_size + stages * block_n * (qk_dim * qk_size + v_dim * q_size);
}

// fp8 k and v under a 16-bit q (kv_size 1) land in staging entries of their own, which the kernel
// widens into its slots of q's type: each a K or a V block of block_n rows of the wider head dim
// (rounded to 64) in bytes, or where q is split, V's alone. With fp8 q, k and v (q_size 1) K lands
// in its slot and V alone in an entry, block_n rows of head_dim_v rounded to 128 bytes, which the
// kernel transposes into its slot. The bytes of one entry, or 0 for 16-bit k and v.
KILN_PARAMS_FN constexpr long long attention_forward_tma_fp8_entry_bytes(
    long long head_dim, long long head_dim_v, long long block_n, long long q_size,
    long long qk_size, long long kv_size) {
  if (q_size == 1) return block_n * ((head_dim_v + 127) / 128 * 128);
  const long long widest =
      attention_forward_tma_widens_k(q_size, qk_size, kv_size) && head_dim > head_dim_v
          ? head_dim
          : head_dim_v;
  return kv_size == 1 ? block_n * ((widest + 63) / 64 * 64) : 0;
}

// The tma kernel's dynamic shared memory with `entries` fp8 staging entries, with or without the
// output staging tile: 1024 bytes of alignment slack, Q and the K/V slots, the entries, and the
// output staging tile (or, without it, the larger of the tiles and that tile, which then reuses
// them as attention_forward_wgmma's does).
KILN_PARAMS_FN constexpr long long attention_forward_tma_layout_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long qk_size, long long kv_size, long long out_size,
    long long entries, bool staged) {
  const long long tiles = attention_forward_tma_tile_bytes(head_dim, head_dim_v, block_m, block_n,
                                                           stages, q_size, qk_size) +
                          entries * attention_forward_tma_fp8_entry_bytes(
                                        head_dim, head_dim_v, block_n, q_size, qk_size, kv_size);
  const long long staging = attention_forward_wgmma_staging_bytes(head_dim_v, block_m, out_size);
  if (staged) return 1024 + tiles + staging;
  return 1024 + (tiles > staging ? tiles : staging);
}

// The fewest fp8 staging entries the tma kernel runs with: `stages` where K is widened (a block's
// K and V each take one), else 2 (V's alone).
KILN_PARAMS_FN constexpr long long attention_forward_tma_least_fp8_entries(long long stages,
                                                                           long long q_size,
                                                                           long long qk_size,
                                                                           long long kv_size) {
  return attention_forward_tma_widens_k(q_size, qk_size, kv_size) ? stages : 2;
}

// How many fp8 staging entries the tma kernel takes (0 for 16-bit k and v): the most, up to two
// a stage where K is widened (a K and a V block each), else one, that fit its budget with the
// output staging tile, else the most that fit without it; at least
// attention_forward_tma_least_fp8_entries, else none fit (0: the config does not fit).
KILN_PARAMS_FN constexpr long long attention_forward_tma_fp8_entries(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long qk_size, long long kv_size, long long out_size) {
  if (kv_size != 1) return 0;
  const long long least = attention_forward_tma_least_fp8_entries(stages, q_size, qk_size, kv_size);
  const long long most =
      attention_forward_tma_widens_k(q_size, qk_size, kv_size) ? 2 * stages : stages;
  for (int staged = 1; staged >= 0; --staged) {
    for (long long entries = most; entries >= least; --entries) {
      if (attention_forward_tma_layout_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size,
                                             qk_size, kv_size, out_size, entries,
                                             staged == 1) <= attention_forward_tma_budget_bytes()) {
        return entries;
      }
    }
  }
  return 0;
}

// Whether attention_forward_tma stages its output in a tile of its own, which must fit its budget
// beside the tiles (and fp8 staging entries), so that a tile's output is copied out
// with bulk copies while the next tile computes; otherwise each thread stores its share of the
// output from registers.
KILN_PARAMS_FN constexpr bool attention_forward_tma_staged(long long head_dim, long long head_dim_v,
                                                           long long block_m, long long block_n,
                                                           long long stages, long long q_size,
                                                           long long qk_size, long long kv_size,
                                                           long long out_size) {
  const long long entries = attention_forward_tma_fp8_entries(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, qk_size, kv_size, out_size);
  return attention_forward_tma_layout_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size,
                                            qk_size, kv_size, out_size, entries,
                                            true) <= attention_forward_tma_budget_bytes();
}

// Dynamic shared memory of attention_forward_tma: its layout with its fp8 staging entries, and
// the output staging tile where it fits. fp8 k and v with no room for the fewest entries get the
// layout with that many, above the budget, whose kernel refuses to compile.
KILN_PARAMS_FN constexpr long long attention_forward_tma_smem_bytes(
    long long head_dim, long long head_dim_v, long long block_m, long long block_n,
    long long stages, long long q_size, long long qk_size, long long kv_size, long long out_size) {
  const long long entries = attention_forward_tma_fp8_entries(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, qk_size, kv_size, out_size);
  return attention_forward_tma_layout_bytes(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, qk_size, kv_size, out_size,
      kv_size == 1 && entries == 0
          ? attention_forward_tma_least_fp8_entries(stages, q_size, qk_size, kv_size)
          : entries,
      attention_forward_tma_staged(head_dim, head_dim_v, block_m, block_n, stages, q_size, qk_size,
                                   kv_size, out_size));
}

// Dynamic shared memory of attention_forward_portable, in bytes: one K and one V tile of block_n
// rows, unpadded (at each step a warp's lanes read 16-byte chunks of one key row, which fall in
// distinct banks). Queries and outputs stay in registers.
KILN_PARAMS_FN constexpr long long attention_forward_portable_smem_bytes(long long head_dim,
                                                                         long long head_dim_v,
                                                                         long long block_n,
                                                                         long long kv_size) {
  return kv_size * block_n * (head_dim + head_dim_v);
}

}  // namespace kiln
