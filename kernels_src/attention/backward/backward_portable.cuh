// SPDX-License-Identifier: Apache-2.0
// The backward pass without tensor cores, inline assembly or atomics, for AMD targets and as a
// cross-check on NVIDIA: FlashAttention-2's recomputation of each probability from the forward's
// LSE, in fp32, split in two kernels so that every gradient has one writer and a fixed order of
// additions (deterministic):
//   attention_backward_dkdv_portable: a CTA per (block_n keys, kv head, batch) holds its keys'
//     k and v rows and dk and dv accumulators in registers and goes through the query rows that
//     attend them, block_m at a time staged in shared memory, for every query head of the kv
//     head's group (GQA sums there). Keys no query attends get zeros.
//   attention_backward_dq_portable: a CTA per (block_m query rows, head, batch) holds its rows'
//     q and dout and dq accumulators and goes through the key blocks they attend, as the
//     forward (attention/prefill/forward_portable.cuh) does.
// Per (query i, key j), with P = exp(logit - lse_i) and D_i = rowsum(dO_i * O_i) from
// attention/backward/dot.cuh:  dV_j += P dO_i;  dS = P (dO_i . v_j - D_i) d logit / d score;
// dK_j += dS q_i;  dQ_i += dS k_j. With has_dbias the dk/dv kernel also writes dL / d logit =
// P (dO_i . v_j - D_i), the bias's gradient (the bias joins the logit after the softcap), to
// bp.maybe_dbias_accum.
//
// Spec constants (both kernels): as attention_forward_portable's: dtype_q, dtype_kv, dtype_out,
// head_dim, head_dim_v, band, varlen, has_softcap, has_alibi, has_bias (and a user variant,
// whose logit hook's derivative LogitTransform::score_grad takes), block_m, block_n, and warps
// (warps * 32 threads; warps * 32 / block_n lanes share a key in dkdv, warps * 32 / block_m a
// query row in dq); dkdv also has_dbias.
//
// Launch, after attention_backward_dot: dkdv on grid (ceil(seqlen_k / block_n), heads_kv,
// batch), seqlen_k the longest sequence's stored keys, with dynamic shared memory
// attention_backward_dkdv_portable_smem_bytes(head_dim, head_dim_v, block_m, q_size, out_size);
// dq on grid (ceil(seqlen_q / block_m), heads, batch) with attention_forward_portable_smem_bytes(
// head_dim, head_dim_v, block_n, kv_size). Do not launch an empty grid.
#pragma once

#include "attention/backward/rows.cuh"
#include "attention/core/lane_chunks.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/math.cuh"
#include "attention/core/tile_copy.cuh"
#include "attention/core/traits.cuh"
#include "attention/prefill/logits.cuh"
#include "attention/prefill/sequence.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention.h"
#include "kiln/params/attention_backward.h"

namespace kiln {
namespace attention {

template <class Spec>
struct BackwardPortableTraits : HeadTraits<Spec> {
  using Head = HeadTraits<Spec>;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int threads = static_cast<int>(Spec::warps) * 32;
  static constexpr int key_lanes = block_n >= 1 ? threads / block_n : 0;  // dkdv
  static constexpr int row_lanes = block_m >= 1 ? threads / block_m : 0;  // dq

  static_assert(threads >= KILN_WARP_SIZE && threads <= 1024 && threads % KILN_WARP_SIZE == 0,
                "warps * 32 must be a multiple of the warp size (64 on AMD, so an even number "
                "of warps there) and at most 1024.");
  static_assert(block_n >= 1 && block_n * key_lanes == threads && key_lanes <= 32 &&
                    (key_lanes & (key_lanes - 1)) == 0,
                "warps * 32 / block_n, the lanes that share a key, must be 1, 2, 4, 8, 16 or 32.");
  static_assert(block_n % 8 == 0, "block_n must be a multiple of 8 (dq steps 8 keys at a time).");
  static_assert(block_m >= 1 && block_m * row_lanes == threads && row_lanes <= 32 &&
                    (row_lanes & (row_lanes - 1)) == 0,
                "warps * 32 / block_m, the lanes that share a query row, must be 1, 2, 4, 8, 16 "
                "or 32.");

  static constexpr int qk_chunks = Head::head_dim / 8;
  static constexpr int v_chunks = Head::head_dim_v / 8;

  // dkdv's shared memory: the Q tile, the dO tile, then each row's LSE (log2 units) and D.
  static constexpr int q_bytes = block_m * Head::head_dim * Head::q_size;
  static constexpr int dout_bytes = block_m * Head::head_dim_v * Head::out_size;
  static constexpr long long dkdv_smem_bytes = attention_backward_dkdv_portable_smem_bytes(
      Head::head_dim, Head::head_dim_v, block_m, Head::q_size, Head::out_size);
  static_assert(dkdv_smem_bytes == q_bytes + dout_bytes + 2 * block_m * 4,
                "attention_backward_dkdv_portable_smem_bytes disagrees with the kernel's layout.");
  // dq's: the K tile, then the V tile, as the forward's.
  static constexpr int k_bytes = block_n * Head::head_dim * Head::kv_size;
  static constexpr long long dq_smem_bytes = attention_forward_portable_smem_bytes(
      Head::head_dim, Head::head_dim_v, block_n, Head::kv_size);
  static_assert(dkdv_smem_bytes <= 64 * 1024 && dq_smem_bytes <= 64 * 1024,
                "the tiles need more than 64 KiB of shared memory, an AMD workgroup's limit: "
                "lower block_m or block_n.");
};

// Loads this lane's chunks of a row (for_lane_chunks) into x, as fp32.
template <int Chunks, int Lanes, class T>
__device__ __forceinline__ void load_lane_chunks(float (&x)[lane_chunks(Chunks, Lanes)][8],
                                                 const T* row, int lane) {
  for_lane_chunks<Chunks, Lanes>(lane, [&](int i, int col) { load_chunk(x[i], row + col); });
}

template <int Chunks, int Lanes, class T>
__device__ __forceinline__ void store_lane_chunks(T* row,
                                                  const float (&x)[lane_chunks(Chunks, Lanes)][8],
                                                  int lane) {
  for_lane_chunks<Chunks, Lanes>(lane, [&](int i, int col) { store_chunk(row + col, x[i]); });
}

// x . the Dim-element row at `row` (shared memory), over the group of Lanes lanes, in each.
template <int Dim, int Lanes, class T>
__device__ __forceinline__ float row_dot(const float (&x)[lane_chunks(Dim / 8, Lanes)][8],
                                         const T* row, int lane) {
  float s[1];
  tile_dots<1, Dim, Lanes>(s, x, row, lane);
  return s[0];
}

// acc += w * the Dim-element row at `row`, for this lane's chunks.
template <int Dim, int Lanes, class T>
__device__ __forceinline__ void row_accumulate(float (&acc)[lane_chunks(Dim / 8, Lanes)][8],
                                               float w, const T* row, int lane) {
  const float weights[1] = {w};
  tile_accumulate<1, Dim, Lanes>(acc, weights, row, lane);
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardPortableTraits<Spec>::threads)
    attention_backward_dkdv_portable(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardPortableTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  using Out = typename Tr::Out;
  using Math = LibraryMath;
  constexpr int kLanes = Tr::key_lanes;
  constexpr int kQK = lane_chunks(Tr::qk_chunks, kLanes);
  constexpr int kV = lane_chunks(Tr::v_chunks, kLanes);
  const AttentionParams& p = bp.fwd;

  extern __shared__ uint4 smem_chunks[];
  unsigned char* const smem = reinterpret_cast<unsigned char*>(smem_chunks);
  Q* const q_tile = reinterpret_cast<Q*>(smem);
  Out* const dout_tile = reinterpret_cast<Out*>(smem + Tr::q_bytes);
  float* const lse_tile = reinterpret_cast<float*>(smem + Tr::q_bytes + Tr::dout_bytes);
  float* const dot_tile = lse_tile + Tr::block_m;

  const KeyBlockTile tile = key_block_tile<Spec, Tr::block_n>(p);
  const int batch = tile.batch;
  const int key0 = tile.key0;
  if (key0 >= tile.stored) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kLanes;
  const int key = key0 + thread / kLanes;

  // K/V rows are the same for every query head of the group.
  const Sequence& first = tile.first;
  const Band& band = tile.band;
  float k[kQK][8], v[kV][8], dk[kQK][8], dv[kV][8];
  fill(k, 0.f);
  fill(v, 0.f);
  fill(dk, 0.f);
  fill(dv, 0.f);
  if (key < first.seqlen_k) {
    const auto kv = sequence_kv<Spec, KV>(p, first);
    long long k_off, v_off;
    kv.offsets(key, k_off, v_off);
    load_lane_chunks<Tr::qk_chunks, kLanes>(k, kv.k + k_off, lane);
    load_lane_chunks<Tr::v_chunks, kLanes>(v, kv.v + v_off, lane);
  }

  const int row_begin = tile.rows.begin;
  const int row_end = tile.rows.end;
  for (int head = tile.first_head; head < tile.first_head + tile.heads && row_begin < row_end;
       ++head) {
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, head);
    auto transform = make_logit_transform<Spec, Math, 1>(p, seq, band, row_begin);
    const float to_log2 = transform.to_log2();
    const Q* const q_rows = static_cast<const Q*>(p.q) + seq.q_offset;
    const Out* const dout_rows =
        static_cast<const Out*>(bp.dout) + dout_offset<Spec::varlen>(bp, batch, head);
    float* dbias_rows = nullptr;
    if constexpr (Spec::has_dbias) dbias_rows = dbias_accum_rows(bp, batch, head);
    for (int r0 = row_begin; r0 < row_end; r0 += Tr::block_m) {
      const int rows = min(Tr::block_m, row_end - r0);
      __syncthreads();  // every lane is done with the previous tiles
      load_tile<Tr::block_m, Tr::head_dim, Tr::head_dim, Tr::threads>(
          q_tile, q_rows + r0 * p.q_seq_stride, p.q_seq_stride, rows, thread);
      load_tile<Tr::block_m, Tr::head_dim_v, Tr::head_dim_v, Tr::threads>(
          dout_tile, dout_rows + r0 * bp.dout_seq_stride, bp.dout_seq_stride, rows, thread);
      for (int r = thread; r < rows; r += Tr::threads) {
        lse_tile[r] = p.maybe_lse[seq.lse_offset + r0 + r] * kLog2e;
        dot_tile[r] = bp.row_dot[seq.lse_offset + r0 + r];
      }
      __syncthreads();
      for (int r = 0; r < rows; ++r) {
        const int i = r0 + r;
        const float score = row_dot<Tr::head_dim, kLanes>(k, q_tile + r * Tr::head_dim, lane);
        const float dp = row_dot<Tr::head_dim_v, kLanes>(v, dout_tile + r * Tr::head_dim_v, lane);
        float logit[1] = {score};
        transform.rows[0] = transform.row_at(i);
        transform.apply(logit, key, true, [&] { mask_row(logit, band, i, key); });
        const float prob = probability(logit[0], to_log2, lse_tile[r]);
        const float dlogit = prob * (dp - dot_tile[r]);  // the bias's gradient
        const float ds =
            transform.score_ds(dlogit, transform.score_grad(score, transform.rows[0], i, key));
        if constexpr (Spec::has_dbias) {
          if (lane == 0 && key < tile.stored) {
            dbias_rows[static_cast<long long>(i) * p.seqlen_k + key] = dlogit;
          }
        }
        row_accumulate<Tr::head_dim_v, kLanes>(dv, prob, dout_tile + r * Tr::head_dim_v, lane);
        row_accumulate<Tr::head_dim, kLanes>(dk, ds, q_tile + r * Tr::head_dim, lane);
      }
    }
  }

  if (key >= tile.stored) return;
  const auto grads = grad_rows<Spec::varlen, KV>(bp, batch, tile.head_kv);
  long long k_off, v_off;
  grads.offsets(key, k_off, v_off);
  store_lane_chunks<Tr::qk_chunks, kLanes>(grads.k + k_off, dk, lane);
  store_lane_chunks<Tr::v_chunks, kLanes>(grads.v + v_off, dv, lane);
}

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardPortableTraits<Spec>::threads)
    attention_backward_dq_portable(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardPortableTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  using Out = typename Tr::Out;
  using Math = LibraryMath;
  constexpr int kLanes = Tr::row_lanes;
  constexpr int kQK = lane_chunks(Tr::qk_chunks, kLanes);
  constexpr int kV = lane_chunks(Tr::v_chunks, kLanes);
  const AttentionParams& p = bp.fwd;

  extern __shared__ uint4 smem_chunks[];
  KV* const k_tile = reinterpret_cast<KV*>(smem_chunks);
  KV* const v_tile =
      reinterpret_cast<KV*>(reinterpret_cast<unsigned char*>(smem_chunks) + Tr::k_bytes);

  const Tile tile = cta_tile<Spec, Tr::block_m, Tr::block_n>(p);
  const Sequence& seq = tile.seq;
  const Band& band = tile.band;
  const KeyBlocks& blocks = tile.blocks;
  if (tile.rows.begin >= tile.rows.end) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kLanes;
  // Rows past the block's end compute along (for the shuffles) but read and write nothing.
  const int row = tile.rows.begin + thread / kLanes;
  const bool row_valid = row < tile.rows.end;

  const auto transform = make_logit_transform<Spec, Math, 1>(p, seq, band, row);
  const float to_log2 = transform.to_log2();
  float q[kQK][8], dout[kV][8], dq[kQK][8];
  fill(q, 0.f);
  fill(dout, 0.f);
  fill(dq, 0.f);
  float lse = neg_inf();  // in log2 units; -inf: the row takes no part
  float dot = 0.f;
  if (row_valid) {
    load_lane_chunks<Tr::qk_chunks, kLanes>(
        q, static_cast<const Q*>(p.q) + seq.q_offset + row * p.q_seq_stride, lane);
    load_lane_chunks<Tr::v_chunks, kLanes>(dout,
                                           static_cast<const Out*>(bp.dout) +
                                               dout_offset<Spec::varlen>(bp, seq.batch, seq.head) +
                                               row * bp.dout_seq_stride,
                                           lane);
    lse = p.maybe_lse[seq.lse_offset + row] * kLog2e;
    dot = bp.row_dot[seq.lse_offset + row];
  }

  const auto kv = sequence_kv<Spec, KV>(p, seq);
  for (int block = blocks.begin; block < blocks.end; ++block) {
    const int key0 = block * Tr::block_n;
    __syncthreads();  // every lane is done with the previous tiles
    load_tile<Tr::block_n, Tr::head_dim, Tr::head_dim, Tr::threads>(
        k_tile, kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, seq.seqlen_k - key0, thread);
    load_tile<Tr::block_n, Tr::head_dim_v, Tr::head_dim_v, Tr::threads>(
        v_tile, kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride, seq.seqlen_k - key0, thread);
    __syncthreads();

    // Eight keys at a time: with the whole tile's scores, dots and probabilities in arrays of
    // block_n, the compiler kept them in local memory (6.7 KB of spills at head dim 128).
    const bool masked = blocks.needs_mask(block, Tr::block_n);
#pragma unroll 1
    for (int sub = 0; sub < Tr::block_n; sub += 8) {
      const int first = key0 + sub;
      const KV* const k_rows = k_tile + sub * Tr::head_dim;
      float s[8], dp[8], score[8];
      tile_dots<8, Tr::head_dim, kLanes>(s, q, k_rows, lane);
      tile_dots<8, Tr::head_dim_v, kLanes>(dp, dout, v_tile + sub * Tr::head_dim_v, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j) score[j] = s[j];
      transform.apply(s, first, masked, [&] { mask_row(s, band, row, first); });
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[j] =
            transform.score_ds(probability(s[j], to_log2, lse) * (dp[j] - dot),
                               transform.score_grad(score[j], transform.rows[0], row, first + j));
      }
      tile_accumulate<8, Tr::head_dim, kLanes>(dq, s, k_rows, lane);
    }
  }

  if (!row_valid) return;
  store_lane_chunks<Tr::qk_chunks, kLanes>(static_cast<Q*>(bp.dq) +
                                               dq_offset<Spec::varlen>(bp, seq.batch, seq.head) +
                                               row * bp.dq_seq_stride,
                                           dq, lane);
}

}  // namespace kiln
