// SPDX-License-Identifier: Apache-2.0
// The backward pass on Hopper's warpgroup MMA (sm_90a): FlashAttention-2's recomputation, with
// every product a wgmma.mma_async and dQ accumulated across key blocks through fp32 atomics (so
// not deterministic; deterministic calls take the mma kernels).
//   attention_backward_dkdv_wgmma: a CTA per (block_n keys, kv head, batch), one warpgroup per 64
//     keys, holds its keys' K and V tiles in shared memory and their dK and dV in registers, and
//     streams the query rows that attend them, block_m at a time, for every query head of the
//     group, Q and dO in two cp.async slots. Per streamed block, with the scores transposed
//     (keys as the wgmma's M, so that P^T and dS^T are A operands straight from registers):
//       S^T = K Q^T and dP^T = V dO^T (both operands in shared memory), P^T = exp(logit - lse),
//       dS^T = P^T (dP^T - D) d logit / d score (with has_dbias, P^T (dP^T - D) also goes to
//       bp.maybe_dbias_accum, as the mma kernel's), dV += P^T dO and dK += dS^T Q (A in registers),
//     then dS^T goes to shared memory and dQ = dS K (A read transposed) is added to the fp32
//     accumulators bp.maybe_dq_accum with red.global.add.
//   attention_backward_dq_wgmma: converts the accumulators into dq, in q's dtype and dq's layout.
// D = rowsum(dO * O) comes from attention/backward/dot.cuh, the zeroed accumulators from the
// host. The logit, mask and gradient steps are the mma kernel's (backward_mma.cuh): a warp's 16
// rows of a wgmma accumulator are laid out as an mma.sync one.
//
// Spec constants: as attention_backward_dkdv_mma's (has_dbias the dk/dv kernel's), with
//   block_n   64 or 128: keys a CTA holds, 64 for each warpgroup.
//   warps     block_n / 16.
//   block_m   64 or 128, at most block_n: query rows a step. dQ's block_m x head_dim is split
//             between the warpgroups, each taking 64 rows and a multiple of 64 of the columns.
// head_dim and head_dim_v are padded with zeros to multiples of 64 (the swizzle width), at most
// 128 each.
//
// Launch, after attention_backward_dot and with bp.maybe_dq_accum zeroed: dkdv on grid
// (ceil(seqlen_k / block_n), heads_kv, batch), seqlen_k the longest sequence's stored keys, warps
// * 32 threads, dynamic shared memory attention_backward_wgmma_smem_bytes(head_dim, head_dim_v,
// block_m, block_n) from "kiln/params/attention_backward.h"; then dq on grid (ceil(seqlen_q /
// block_m), heads, batch), warps * 32 threads, no shared memory.
#pragma once

#include "attention/backward/backward_mma.cuh"
#include "attention/core/lane_chunks.cuh"
#include "attention/prefill/forward_wgmma.cuh"
#include "common/wgmma.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct BackwardWgmmaTraits : HeadTraits<Spec> {
  using T = typename HeadTraits<Spec>::Q;
  using HeadTraits<Spec>::head_dim;
  using HeadTraits<Spec>::head_dim_v;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int warpgroups = block_n / 64;
  static constexpr int threads = warps * 32;
  static_assert(block_n == 64 || block_n == 128, "block_n must be 64 or 128: 64 keys a warpgroup.");
  static_assert(warps == block_n / 16, "warps must be block_n / 16: a warpgroup per 64 keys.");
  static_assert((block_m == 64 || block_m == 128) && block_m <= block_n,
                "block_m must be 64 or 128, at most block_n.");

  static constexpr int qk_dim = round_up(head_dim, 64);
  static constexpr int v_dim = round_up(head_dim_v, 64);
  static_assert(qk_dim <= 128 && v_dim <= 128,
                "the wgmma backward takes head dims up to 128: dK and dV stay in registers.");

  // The per-warp fragment shapes of the mma kernel's helpers: a warp's 16 keys against block_m
  // query columns.
  static constexpr int s_tiles = block_m / 8;

  // dQ's split: warpgroup w takes 64 rows, dq_m_tile(w), and dq_cols columns from dq_col(w).
  static constexpr int dq_m_tiles = block_m / 64;
  static constexpr int dq_cols = qk_dim * dq_m_tiles / warpgroups;
  static_assert(dq_cols % 64 == 0,
                "dQ's columns split between warpgroups in multiples of 64: raise block_m.");

  // Shared memory from the 1024-aligned base: K, V, dS^T (block_n rows of block_m), then two
  // slots of Q, dO and their rows' LSE and D, each piece 1024-aligned.
  static constexpr int k_bytes = block_n * qk_dim * 2;
  static constexpr int v_bytes = block_n * v_dim * 2;
  static constexpr int ds_bytes = block_n * block_m * 2;
  static constexpr int q_bytes = block_m * qk_dim * 2;
  static constexpr int dout_bytes = block_m * v_dim * 2;
  static constexpr int slot_bytes = round_up(q_bytes + dout_bytes + 2 * block_m * 4, 1024);
  static constexpr long long smem_bytes =
      attention_backward_wgmma_smem_bytes(head_dim, head_dim_v, block_m, block_n);
  static_assert(smem_bytes == 1024 + k_bytes + v_bytes + ds_bytes + 2 * slot_bytes,
                "attention_backward_wgmma_smem_bytes disagrees with the kernel's layout.");
  // dK and dV are staged through the tiles' memory (rows padded as the mma kernel's) to store.
  static constexpr int qk_pitch = qk_dim + 8;
  static constexpr int v_pitch = v_dim + 8;
  static_assert(block_n * (qk_pitch + v_pitch) * 2 <= smem_bytes - 1024,
                "dK and dV's staging does not fit the tiles.");
};

// Adds a warpgroup's 64-row fp32 accumulator of Cols columns to rows row0 + (the fragment's row)
// of `accum` (row_stride floats a row), skipping rows from rows_end and columns from cols. One
// address a row, stepped (opaque to the optimizer, which otherwise keeps a 64-bit address per
// column live and spills).
template <int Cols>
__device__ __forceinline__ void add_rows(float* accum, long long row_stride,
                                         const float (&acc)[Cols / 2], int row0, int rows_end,
                                         int col0, int cols, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + lane / 4 + 8 * half;
    if (row >= rows_end) continue;
    const int col = col0 + 2 * (lane % 4);
    float* at = accum + row * row_stride + col;
#pragma unroll
    for (int j = 0; j < Cols / 8; ++j) {
      if (col + 8 * j >= cols) break;
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(at), "f"(acc[4 * j + 2 * half]),
                   "f"(acc[4 * j + 2 * half + 1])
                   : "memory");
      at = mma::opaque(at + 8);
    }
  }
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardWgmmaTraits<Spec>::threads, 1)
    attention_backward_dkdv_wgmma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardWgmmaTraits<Spec>;
  using T = typename Tr::T;
  const AttentionParams& p = bp.fwd;

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const unsigned smem_raw = mma::smem_address(wgmma_smem);
  const unsigned k_tile = (smem_raw + 1023) & ~1023u;
  unsigned char* const base = wgmma_smem + (k_tile - smem_raw);
  const unsigned v_tile = k_tile + Tr::k_bytes;
  const unsigned ds_tile = v_tile + Tr::v_bytes;
  const auto slot_at = [&](int slot) { return ds_tile + Tr::ds_bytes + slot * Tr::slot_bytes; };
  // Value f (0: LSE in log2 units, 1: D) of the streamed rows of a slot.
  const auto row_floats = [&](int slot, int f) {
    return reinterpret_cast<float*>(base + (slot_at(slot) - k_tile) + Tr::q_bytes +
                                    Tr::dout_bytes) +
           f * Tr::block_m;
  };

  const KeyBlockTile tile = key_block_tile<Spec, Tr::block_n>(p);
  const int key0 = tile.key0;
  if (key0 >= tile.stored) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int warpgroup = warp / 4;

  const Sequence& first = tile.first;
  const Band& band = tile.band;
  const auto kv = sequence_kv<Spec, T>(p, first);
  load_tile_swizzled<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::threads>(
      k_tile, kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, first.seqlen_k - key0, thread);
  load_tile_swizzled<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::threads>(
      v_tile, kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride, first.seqlen_k - key0, thread);

  const int batch = tile.batch;
  const int row_begin = tile.rows.begin;
  const int row_end = tile.rows.end;
  const int first_head = tile.first_head;
  const int end_head = row_begin < row_end ? first_head + tile.heads : first_head;
  struct Step {
    int head, r0;
  };
  const auto after = [&](Step at) {
    return at.r0 + Tr::block_m < row_end ? Step{at.head, at.r0 + Tr::block_m}
                                         : Step{at.head + 1, row_begin};
  };
  struct RowValues {
    float lse, dot;
  };
  const auto load_rows = [&](Step at, int slot) {
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
    const int rows = row_end - at.r0;
    load_tile_swizzled<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::threads>(
        slot_at(slot), static_cast<const T*>(p.q) + seq.q_offset + at.r0 * p.q_seq_stride,
        p.q_seq_stride, rows, thread);
    load_tile_swizzled<Tr::block_m, Tr::head_dim_v, Tr::v_dim, Tr::threads>(
        slot_at(slot) + Tr::q_bytes,
        static_cast<const T*>(bp.dout) + dout_offset<Spec::varlen>(bp, batch, at.head) +
            at.r0 * bp.dout_seq_stride,
        bp.dout_seq_stride, rows, thread);
    RowValues values{neg_inf(), 0.f};
    if (thread < rows && thread < Tr::block_m) {
      values.lse = p.maybe_lse[seq.lse_offset + at.r0 + thread] * kLog2e;
      values.dot = bp.row_dot[seq.lse_offset + at.r0 + thread];
    }
    return values;
  };
  const auto store_rows = [&](const RowValues& values, int slot) {
    if (thread < Tr::block_m) {
      row_floats(slot, 0)[thread] = values.lse;
      row_floats(slot, 1)[thread] = values.dot;
    }
  };
  if (first_head < end_head) store_rows(load_rows({first_head, row_begin}, 0), 0);
  mma::cp_async_commit();

  // The warp's 16 keys of its warpgroup's 64: this thread's are key_row and key_row + 8.
  const int warp_row = warpgroup * 64 + (warp % 4) * 16;
  const int key_row = key0 + warp_row + lane / 4;
  const unsigned k_rows = k_tile + warpgroup * 64 * 128;
  const unsigned v_rows = v_tile + warpgroup * 64 * 128;
  // dQ's share of this warpgroup: rows dq_row0 of a step, columns from dq_col0.
  const int dq_m_tile = warpgroup % Tr::dq_m_tiles;
  const int dq_row0 = dq_m_tile * 64 + (warp % 4) * 16;
  const int dq_col0 = warpgroup / Tr::dq_m_tiles * Tr::dq_cols;
  const long long accum_stride = Spec::head_dim;

  float dk[1][Tr::qk_dim / 8][4];
  float dv[1][Tr::v_dim / 8][4];
  zero_fragments(dk);
  zero_fragments(dv);
  int slot = 0;
  for (Step at{first_head, row_begin}; at.head < end_head; at = after(at), slot = 1 - slot) {
    mma::cp_async_wait<0>();
    wgmma::fence_shared_for_async();
    __syncthreads();  // the slot is visible to all, and every warp is done with the other one
    const bool more = after(at).head < end_head;
    RowValues next{};
    if (more) next = load_rows(after(at), 1 - slot);
    mma::cp_async_commit();

    const unsigned q_tile = slot_at(slot);
    const unsigned dout_tile = q_tile + Tr::q_bytes;
    float s[1][Tr::s_tiles][4];
    float dp[1][Tr::s_tiles][4];
    // Two groups: the probabilities are computed while dP^T's products run.
    start_kmajor_product<T, Tr::qk_dim, Tr::block_n, Tr::block_m>(all_columns(s), k_rows, q_tile);
    start_kmajor_product<T, Tr::v_dim, Tr::block_n, Tr::block_m>(all_columns(dp), v_rows,
                                                                 dout_tile);
    wgmma::wait<1>();
    pin_columns(s);

    const int r0 = at.r0;
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
    const auto transform = make_logit_transform<Spec, mma::ApproxMath, 1>(p, seq, band, r0);
    const float* const lse = row_floats(slot, 0);
    const float* const dot = row_floats(slot, 1);
    const int rows_end = min(r0 + Tr::block_m, row_end);
    const bool masked = !tile_in_band(band, r0, rows_end, key0, Tr::block_n);
    const bool edge = r0 + Tr::block_m > seq.seqlen_q || key0 + Tr::block_n > seq.seqlen_k;
    const int query_col = r0 + 2 * (lane % 4);
    float grad[1][Tr::s_tiles][4];
    transposed_derivatives(grad, s, transform, key_row, query_col);
    if (transform.has_bias && edge) {
      transposed_logits<true>(s, transform, key_row, query_col);
    } else {
      transposed_logits<false>(s, transform, key_row, query_col);
    }
    if (masked) mask_transposed(s, band, key_row, query_col);
    logits_to_probs(s, transform.to_log2(),
                    [&](int nt, int e) { return lse[fragment_col(nt, e, lane)]; });
    wgmma::wait<0>();
    pin_columns(dp);
    const auto query_dot = [&](int nt, int e) { return dot[fragment_col(nt, e, lane)]; };
    if constexpr (Spec::has_dbias) {
      store_transposed_dlogits(dbias_accum_rows(bp, batch, at.head), p.seqlen_k, s, dp, query_dot,
                               key_row, tile.stored, query_col, rows_end);
    }
    dp_to_ds(dp, s, grad, transform, query_dot);

    // dV += P^T dO and dK += dS^T Q, while dS^T goes to shared memory for dQ.
    unsigned a[Tr::block_m / 16][4];
#pragma unroll
    for (int kk = 0; kk < Tr::block_m / 16; ++kk) probability_fragment<T>(a[kk], s, kk);
    start_nmajor_product<T, Tr::block_m, Tr::v_dim>(all_columns(dv), a, dout_tile);
    unsigned b[Tr::block_m / 16][4];
#pragma unroll
    for (int kk = 0; kk < Tr::block_m / 16; ++kk) probability_fragment<T>(b[kk], dp, kk);
    start_nmajor_product<T, Tr::block_m, Tr::qk_dim>(all_columns(dk), b, q_tile);
    // From the packed fragments, so that the fp32 S and dS die here: b[kk][x] holds row
    // lane / 4 + 8 (x % 2), columns 16 kk + 8 (x / 2) + 2 (lane % 4) and the next.
#pragma unroll
    for (int kk = 0; kk < Tr::block_m / 16; ++kk) {
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int row = warp_row + lane / 4 + 8 * (x % 2);
        const int col = 16 * kk + 8 * (x / 2) + 2 * (lane % 4);
        *reinterpret_cast<unsigned*>(base + (ds_tile - k_tile) +
                                     wgmma::swizzled_offset(Tr::block_n, row, col / 8) +
                                     (col % 8) * 2) = b[kk][x];
      }
    }
    wgmma::fence_shared_for_async();
    // dK and dV's products done, their A fragments free for dQ's accumulators (or they spill).
    wgmma::wait<0>();
    pin_columns(dk);
    pin_columns(dv);
    __syncthreads();  // dS^T whole in shared memory

    // dQ (block_m x qk_dim) = dS K: this warpgroup's 64 rows and dq_cols columns, dS read
    // transposed (M-major) from the dS^T tile, K N-major.
    float dq[Tr::dq_cols / 2];
    wgmma::fence();
    {
      const unsigned long long ds_desc =
          wgmma::descriptor(ds_tile + dq_m_tile * Tr::block_n * 128, Tr::block_n * 128, 1024);
      const unsigned long long k_desc =
          wgmma::descriptor(k_tile + dq_col0 / 64 * Tr::block_n * 128, Tr::block_n * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
        wgmma::mma_ss<T, true, Tr::dq_cols, true>(dq, wgmma::advance(ds_desc, kk * 16 * 128),
                                                  wgmma::advance(k_desc, kk * 16 * 128), kk > 0);
      }
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::pin(dq);
    add_rows<Tr::dq_cols>(bp.maybe_dq_accum + (seq.lse_offset + r0) * accum_stride, accum_stride,
                          dq, dq_row0, rows_end - r0, dq_col0, Spec::head_dim, lane);
    if (more) store_rows(next, 1 - slot);
  }

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the tiles the gradients are staged in
  T* const staged_k = reinterpret_cast<T*>(base);
  T* const staged_v = staged_k + Tr::block_n * Tr::qk_pitch;
  stage_fragments<Tr::qk_pitch>(staged_k, dk, warp_row, 0, lane);
  stage_fragments<Tr::v_pitch>(staged_v, dv, warp_row, 0, lane);
  __syncthreads();
  const auto grads = grad_rows<Spec::varlen, T>(bp, batch, tile.head_kv);
  store_tile<Tr::block_n, Tr::head_dim, Tr::qk_pitch, Tr::threads>(
      grads.k + key0 * grads.k_seq_stride, grads.k_seq_stride, staged_k, tile.stored - key0,
      thread);
  store_tile<Tr::block_n, Tr::head_dim_v, Tr::v_pitch, Tr::threads>(
      grads.v + key0 * grads.v_seq_stride, grads.v_seq_stride, staged_v, tile.stored - key0,
      thread);
}

// dq = the fp32 accumulators of block_m query rows, in q's dtype.
template <class Spec>
__global__ void __launch_bounds__(attention::BackwardWgmmaTraits<Spec>::threads)
    attention_backward_dq_wgmma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardWgmmaTraits<Spec>;
  using T = typename Tr::T;
  constexpr int kChunks = Spec::head_dim / 8;
  const AttentionParams& p = bp.fwd;
  const int batch = static_cast<int>(blockIdx.z);
  const int head = static_cast<int>(blockIdx.y);
  const Sequence seq = locate_sequence<Spec::varlen>(p, batch, head);
  const int row0 = static_cast<int>(blockIdx.x) * Tr::block_m;
  T* const dq = static_cast<T*>(bp.dq) + dq_offset<Spec::varlen>(bp, batch, head);
  for (int i = static_cast<int>(threadIdx.x); i < Tr::block_m * kChunks; i += Tr::threads) {
    const int row = row0 + i / kChunks;
    if (row >= seq.seqlen_q) break;
    const int col = i % kChunks * 8;
    float x[8];
    load_chunk(x, bp.maybe_dq_accum + (seq.lse_offset + row) * Spec::head_dim + col);
    store_chunk(dq + row * bp.dq_seq_stride + col, x);
  }
}

}  // namespace kiln
