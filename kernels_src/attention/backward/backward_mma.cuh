// SPDX-License-Identifier: Apache-2.0
// The backward pass on tensor cores (sm_80+, mma.sync m16n8k16, fp32 accumulators):
// FlashAttention-2's recomputation of each probability from the forward's LSE, split in two
// kernels so that every gradient has one writer and a fixed order of additions (deterministic):
//   attention_backward_dkdv_mma: a CTA per (block_n keys, kv head, batch) holds its keys' K and
//     V tiles in shared memory and their dK and dV accumulators in registers, and streams the
//     query rows that attend them, block_m at a time, for every query head of the kv head's
//     group (GQA sums there, without atomics). Per streamed block, with the scores transposed
//     (keys as the mma's rows, so that P^T and dS^T are A operands straight from registers):
//       S^T = K Q^T, P^T = exp(logit - lse), dV += P^T dO, dP^T = V dO^T,
//       dS^T = P^T (dP^T - D) d logit / d score, dK += dS^T Q;
//     with has_dbias it also writes P^T (dP^T - D) = dL / d logit, the bias's gradient (the bias
//     joins the logit after the softcap), to bp.maybe_dbias_accum.
//   attention_backward_dq_mma: a CTA per (block_n query rows, head, batch) holds their Q and dO
//     tiles and dQ accumulators and streams the key blocks they attend, block_m keys at a time,
//     as the forward (attention/prefill/forward.cuh) does: S = Q K^T, P, dP = dO V^T, dS,
//     dQ += dS K.
// D = rowsum(dO * O) comes from attention/backward/dot.cuh. Each product is the forward's
// qk_scores or pv_accumulate (attention/core/tile_mma.cuh) over the backward's tiles.
//
// Spec constants (both kernels), as attention_backward_dkdv_portable's: dtype_q, dtype_kv,
// dtype_out (one of f16, bf16 for all), head_dim, head_dim_v, band, varlen, has_softcap,
// has_alibi, has_bias (dkdv also has_dbias) and a user variant, and:
//   block_n   rows a CTA holds (keys in dkdv, query rows in dq), a multiple of 16: 16 for each of
//             block_n / 16 row groups.
//   warps     a multiple of block_n / 16: the warps / (block_n / 16) warps of a row group each
//             accumulate a slice of the head dims (each computes the group's S and dP), which
//             keeps head dim 256's accumulators in registers.
//   block_m   rows streamed a step (query rows in dkdv, keys in dq), a multiple of 16, at most
//             warps * 32; two slots of them, the next loading while one is used.
//
// Launch, after attention_backward_dot: dkdv on grid (ceil(seqlen_k / block_n), heads_kv,
// batch), seqlen_k the longest sequence's stored keys; dq on grid (ceil(seqlen_q / block_n),
// heads, batch); warps * 32 threads; dynamic shared memory attention_backward_mma_smem_bytes(
// head_dim, head_dim_v, block_m, block_n, warps, size, row_floats) with row_floats 2 (dkdv) or 0
// (dq), from "kiln/params/attention_backward.h". Do not launch an empty grid.
#pragma once

#include "attention/backward/rows.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/tile_io.cuh"
#include "attention/core/tile_mma.cuh"
#include "attention/core/traits.cuh"
#include "attention/prefill/logits.cuh"
#include "attention/prefill/sequence.cuh"
#include "common/mma.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention.h"
#include "kiln/params/attention_backward.h"

namespace kiln {
namespace attention {

// What a spec's constants imply for both kernels: "own" tiles are the block_n rows a CTA holds
// (K and V; Q and dO), "streamed" ones the block_m rows of the other side it steps through. The
// names qk_scores and pv_accumulate read (m_tiles, s_tiles, prefetch, the pitches) are those of
// a warp's products: its row group's 16 own rows against a streamed block.
template <class Spec>
struct BackwardMmaTraits : HeadTraits<Spec> {
  using T = typename HeadTraits<Spec>::Q;  // every operand's type (HeadTraits checks)
  using HeadTraits<Spec>::head_dim;
  using HeadTraits<Spec>::head_dim_v;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int threads = warps * 32;
  static constexpr int groups = block_n / 16;
  static_assert(block_n % 16 == 0 && block_n >= 16 && block_n <= 256,
                "block_n must be a multiple of 16 from 16 to 256: 16 rows for each row group.");
  static_assert(warps >= 1 && warps <= 16 && warps % groups == 0,
                "warps must be a multiple of block_n / 16 (the row groups), at most 16.");
  static constexpr int split = warps / groups;  // warps of a row group
  static_assert(block_m % 16 == 0 && block_m >= 16 && block_m <= threads,
                "block_m must be a multiple of 16, at most warps * 32 (a thread loads each "
                "streamed row's LSE and D).");

  // Head dims padded to the mma's 16 for each warp's slice; rows carry 8 extra elements, as the
  // forward's (ForwardTraits), so that ldmatrix's rows fall in distinct bank groups.
  static constexpr int qk_dim = round_up(head_dim, 16 * split);
  static constexpr int v_dim = round_up(head_dim_v, 16 * split);
  static constexpr int qk_pitch = qk_dim + 8;
  static constexpr int v_pitch = v_dim + 8;
  static constexpr int qk_swizzle = 1;
  static constexpr int v_swizzle = 1;
  static constexpr int qk_slice = qk_dim / split;  // a warp's columns of dK or dQ
  static constexpr int v_slice = v_dim / split;    // of dV

  static constexpr int m_tiles = 1;
  static constexpr int s_tiles = block_m / 8;
  static constexpr int prefetch = 0;

  // Shared memory: the own tiles (qk, then v), then two slots of streamed ones (qk, v, and
  // row_floats fp32 values a row), all of T.
  static constexpr int own_qk_elems = block_n * qk_pitch;
  static constexpr int own_elems = own_qk_elems + block_n * v_pitch;
  static constexpr int streamed_qk_elems = block_m * qk_pitch;
  static constexpr int streamed_elems = streamed_qk_elems + block_m * v_pitch;
  template <int RowFloats>
  static constexpr int slot_bytes = streamed_elems * 2 + RowFloats* block_m * 4;
  template <int RowFloats>
  static constexpr long long smem_bytes = attention_backward_mma_smem_bytes(
      head_dim, head_dim_v, block_m, block_n, warps, HeadTraits<Spec>::q_size, RowFloats);
  static_assert(smem_bytes<2> == own_elems * 2 + 2 * slot_bytes<2> &&
                    smem_bytes<0> == own_elems * 2 + 2 * slot_bytes<0>,
                "attention_backward_mma_smem_bytes disagrees with the kernels' layout.");
  static_assert(smem_bytes<2> <= 227 * 1024,
                "the tiles need more than 227 KiB of shared memory: lower block_m or block_n.");
};

// A product's view of the traits. Scores<Tr, Dim, Pitch>: qk_scores over Dim (padded) columns
// of tiles of Pitch-element rows. Accumulate<Tr, Pitch, Cols>: pv_accumulate of Cols columns of
// a streamed tile of Pitch-element rows, block_m of them the product's k.
template <class Tr, int Dim, int Pitch>
struct Scores : Tr {
  static constexpr int qk_dim = Dim;
  static constexpr int qk_pitch = Pitch;
};
template <class Tr, int Pitch, int Cols>
struct Accumulate : Tr {
  static constexpr int v_pitch = Pitch;
  static constexpr int o_tiles = Cols / 8;
  static constexpr int block_n = Tr::block_m;
};

// The shared memory of a CTA with RowFloats fp32 values a streamed row.
template <class Tr, int RowFloats>
struct BackwardMmaTiles {
  using T = typename Tr::T;
  unsigned char* base;

  __device__ __forceinline__ T* own_qk() const { return reinterpret_cast<T*>(base); }
  __device__ __forceinline__ T* own_v() const { return own_qk() + Tr::own_qk_elems; }
  __device__ __forceinline__ unsigned char* slot(int s) const {
    return base + Tr::own_elems * 2 + s * Tr::template slot_bytes<RowFloats>;
  }
  __device__ __forceinline__ T* streamed_qk(int s) const { return reinterpret_cast<T*>(slot(s)); }
  __device__ __forceinline__ T* streamed_v(int s) const {
    return streamed_qk(s) + Tr::streamed_qk_elems;
  }
  // Value f (0 .. RowFloats - 1) of the streamed rows of slot s.
  __device__ __forceinline__ float* row_floats(int s, int f) const {
    return reinterpret_cast<float*>(slot(s) + Tr::streamed_elems * 2) + f * Tr::block_m;
  }
};

// Where a warp works: its row group's first own row and its slice of the head dims.
struct WarpPlace {
  int row;    // within the CTA's own rows
  int slice;  // 0 .. split - 1
};

template <class Tr>
__device__ __forceinline__ WarpPlace warp_place(int warp) {
  return {warp % Tr::groups * 16, warp / Tr::groups};
}

// The lane's ldmatrix offsets of the four products, for a warp whose own rows start at `row`:
// sq (own qk tile against streamed qk rows), sv (own v against streamed v), and the B operands
// of accumulating from the streamed qk and v tiles (their .v).
template <class Tr>
struct ProductLanes {
  LaneOffsets sq, sv, aq, av;
};

template <class Tr>
__device__ __forceinline__ ProductLanes<Tr> product_lanes(int row, int lane) {
  return {lane_offsets<Scores<Tr, Tr::qk_dim, Tr::qk_pitch>>(row, lane),
          lane_offsets<Scores<Tr, Tr::v_dim, Tr::v_pitch>>(row, lane),
          lane_offsets<Accumulate<Tr, Tr::qk_pitch, Tr::qk_slice>>(row, lane),
          lane_offsets<Accumulate<Tr, Tr::v_pitch, Tr::v_slice>>(row, lane)};
}

// One streamed step's products for a warp, as the gradients need them: s = own_qk streamed_qk^T
// (the scores); `to_probs(s)` turns s into P in place, keeping what dS needs (and the dk/dv
// kernel accumulates dV from it); dp = own_v streamed_v^T; `to_ds(s, dp)` turns dp into dS;
// acc += dS streamed_qk over the warp's slice of columns. Tiles are shared-memory byte
// addresses.
template <class Tr, class ToProbs, class ToDs>
__device__ __forceinline__ void backward_step(float (&acc)[1][Tr::qk_slice / 8][4], unsigned own_qk,
                                              unsigned own_v, unsigned streamed_qk,
                                              unsigned streamed_v, const ProductLanes<Tr>& lanes,
                                              int slice, const ToProbs& to_probs,
                                              const ToDs& to_ds) {
  float s[1][Tr::s_tiles][4];
  qk_scores<Scores<Tr, Tr::qk_dim, Tr::qk_pitch>>(s, own_qk + lanes.sq.q, streamed_qk + lanes.sq.k,
                                                  lanes.sq);
  to_probs(s);
  float dp[1][Tr::s_tiles][4];
  qk_scores<Scores<Tr, Tr::v_dim, Tr::v_pitch>>(dp, own_v + lanes.sv.q, streamed_v + lanes.sv.k,
                                                lanes.sv);
  to_ds(s, dp);
  pv_accumulate<Accumulate<Tr, Tr::qk_pitch, Tr::qk_slice>>(
      acc, dp, streamed_qk + lanes.aq.v + slice * Tr::qk_slice * Tr::q_size, lanes.aq);
}

// d logit / d score of each score of a tile, grad_of(nt, e, score): LogitTransform::score_grad
// at element (nt, e)'s row, query and key (without a softcap or a variant's logit_grad, the
// scale, a constant the compiler folds away).
template <int STiles, class GradOf>
__device__ __forceinline__ void logit_derivatives(float (&grad)[1][STiles][4],
                                                  const float (&s)[1][STiles][4],
                                                  const GradOf& grad_of) {
#pragma unroll
  for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) grad[0][nt][e] = grad_of(nt, e, s[0][nt][e]);
  }
}

// The column within the tile (of 8 * STiles) of the thread's fragment element (nt, e); its row
// is lane / 4 + 8 * (e / 2).
__device__ __forceinline__ int fragment_col(int nt, int e, int lane) {
  return 8 * nt + 2 * (lane % 4) + e % 2;
}

// dS = P (dP - D) d logit / d score in place of dp (LogitTransform::score_ds); D of the
// element's row (dq) or column (dk/dv) comes from dot(nt, e).
template <int STiles, class Transform, class Dot>
__device__ __forceinline__ void dp_to_ds(float (&dp)[1][STiles][4],
                                         const float (&prob)[1][STiles][4],
                                         const float (&grad)[1][STiles][4], const Transform& f,
                                         const Dot& dot) {
#pragma unroll
  for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dp[0][nt][e] = f.score_ds(prob[0][nt][e] * (dp[0][nt][e] - dot(nt, e)), grad[0][nt][e]);
    }
  }
}

// P = exp(logit - lse) in place of the logits; the LSE (log2 units) of the element's row (dq) or
// column (dk/dv) comes from lse(nt, e).
template <int STiles, class Lse>
__device__ __forceinline__ void logits_to_probs(float (&s)[1][STiles][4], float to_log2,
                                                const Lse& lse) {
#pragma unroll
  for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[0][nt][e] = probability(s[0][nt][e], to_log2, lse(nt, e));
  }
}

// The dk/dv kernel's transposed scores: element (nt, x) of the thread's tile is key
// key_row + 8 * (x / 2) and query query_col + 8 * nt + x % 2, whose row is f.row_at(query): row
// 0's, with a variant's row state made for the query when it has one.
__device__ __forceinline__ int transposed_query(int query_col, int nt, int x) {
  return query_col + 8 * nt + x % 2;
}
__device__ __forceinline__ int transposed_key(int key_row, int x) {
  return key_row + 8 * (x / 2);
}

// d logit / d score of the dk/dv kernel's transposed scores (logit_derivatives).
template <class Transform, int STiles>
__device__ __forceinline__ void transposed_derivatives(float (&grad)[1][STiles][4],
                                                       const float (&s)[1][STiles][4],
                                                       const Transform& f, int key_row,
                                                       int query_col) {
  logit_derivatives(grad, s, [&](int nt, int x, float score) {
    const int i = transposed_query(query_col, nt, x);
    return f.score_grad(score, f.row_at(i), i, transposed_key(key_row, x));
  });
}

// The logits of the dk/dv kernel's transposed scores.
template <bool Edge, class Transform, int STiles>
__device__ __forceinline__ void transposed_logits(float (&s)[1][STiles][4], const Transform& f,
                                                  int key_row, int query_col) {
  if constexpr (Transform::on) {
#pragma unroll
    for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = transposed_query(query_col, nt, e);
        const auto row = f.row_at(i);  // for both of the query's keys
#pragma unroll
        for (int x = e; x < 4; x += 2) {
          s[0][nt][x] = f.template logit<Edge>(s[0][nt][x], row, i, transposed_key(key_row, x));
        }
      }
    }
  }
}

// Stores dL / d logit = P (dP - D), the bias's gradient, of each element of the dk/dv kernel's
// transposed tile (transposed_logits' coordinates) at rows[query * cols + key], for queries
// before `queries` and keys before `keys`; D of the element's query comes from dot(nt, e).
template <int STiles, class Dot>
__device__ __forceinline__ void store_transposed_dlogits(float* rows, long long cols,
                                                         const float (&prob)[1][STiles][4],
                                                         const float (&dp)[1][STiles][4],
                                                         const Dot& dot, int key_row, int keys,
                                                         int query_col, int queries) {
#pragma unroll
  for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int i = query_col + 8 * nt + x % 2;
      const int j = key_row + 8 * (x / 2);
      if (i < queries && j < keys) {
        rows[i * cols + j] = prob[0][nt][x] * (dp[0][nt][x] - dot(nt, x));
      }
    }
  }
}

// Sets the transposed logits outside each query's band to -inf (keys past seqlen_k among them).
template <int STiles>
__device__ __forceinline__ void mask_transposed(float (&s)[1][STiles][4], const Band& band,
                                                int key_row, int query_col) {
#pragma unroll
  for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int i = query_col + 8 * nt + e;
      const int first = band.first_key(i);
      const int last = band.last_key(i);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int j = key_row + 8 * half;
        if (j < first || j > last) s[0][nt][2 * half + e] = neg_inf();
      }
    }
  }
}

// Whether every key of [key0, key0 + keys) lies in the band of every query of [row0, row_end)
// (rows of a sequence, not past it), so that a tile of them needs no mask.
__device__ __forceinline__ bool tile_in_band(const Band& band, int row0, int row_end, int key0,
                                             int keys) {
  return band.first_key(row_end - 1) <= key0 && band.last_key(row0) >= key0 + keys - 1;
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardMmaTraits<Spec>::threads)
    attention_backward_dkdv_mma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardMmaTraits<Spec>;
  using T = typename Tr::T;
  const AttentionParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const BackwardMmaTiles<Tr, 2> tiles{smem_bytes};  // row floats: LSE (log2 units), D

  const KeyBlockTile tile = key_block_tile<Spec, Tr::block_n>(p);
  const int key0 = tile.key0;
  if (key0 >= tile.stored) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32;
  const int lane = thread % 32;

  // K and V rows are the same for every query head of the group.
  const Sequence& first = tile.first;
  const Band& band = tile.band;
  const auto kv = sequence_kv<Spec, T>(p, first);
  load_tile_async<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
      tiles.own_qk(), kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, first.seqlen_k - key0,
      thread);
  load_tile_async<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, Tr::threads>(
      tiles.own_v(), kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride, first.seqlen_k - key0,
      thread);

  const int batch = tile.batch;
  const RowSteps<Tr::block_m> steps(tile);

  // Starts loading a step's Q and dO rows into `slot` (committing nothing), and returns this
  // thread's row values, which store_rows puts in the slot.
  const auto load_rows = [&](RowStep at, int slot) {
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
    const int rows = steps.row_end - at.r0;
    load_tile_async<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
        tiles.streamed_qk(slot), static_cast<const T*>(p.q) + seq.q_offset + at.r0 * p.q_seq_stride,
        p.q_seq_stride, rows, thread);
    load_tile_async<Tr::block_m, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, Tr::threads>(
        tiles.streamed_v(slot),
        static_cast<const T*>(bp.dout) + dout_offset<Spec::varlen>(bp, batch, at.head) +
            at.r0 * bp.dout_seq_stride,
        bp.dout_seq_stride, rows, thread);
    return thread < Tr::block_m ? row_values(bp, seq.lse_offset, at.r0 + thread, steps.row_end)
                                : RowValues{};
  };
  const auto store_rows = [&](const RowValues& values, int slot) {
    if (thread < Tr::block_m) {
      tiles.row_floats(slot, 0)[thread] = values.lse;
      tiles.row_floats(slot, 1)[thread] = values.dot;
    }
  };
  if (!steps.done(steps.first())) store_rows(load_rows(steps.first(), 0), 0);
  mma::cp_async_commit();

  const WarpPlace place = warp_place<Tr>(warp);
  const ProductLanes<Tr> lanes = product_lanes<Tr>(place.row, lane);
  const unsigned own_qk = mma::smem_address(tiles.own_qk());
  const unsigned own_v = mma::smem_address(tiles.own_v());
  const int key_row = key0 + place.row + lane / 4;  // the thread's keys: this and 8 further

  float dk[1][Tr::qk_slice / 8][4];
  float dv[1][Tr::v_slice / 8][4];
  zero_fragments(dk);
  zero_fragments(dv);
  int slot = 0;
  for (RowStep at = steps.first(); !steps.done(at); at = steps.after(at), slot = 1 - slot) {
    mma::cp_async_wait<0>();
    __syncthreads();  // the slot is visible to all, and every warp is done with the other one
    const bool more = !steps.done(steps.after(at));
    RowValues next{};
    if (more) next = load_rows(steps.after(at), 1 - slot);
    mma::cp_async_commit();

    const int r0 = at.r0;
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
    const auto transform = make_logit_transform<Spec, mma::ApproxMath, 1>(p, seq, band, r0);
    const float to_log2 = transform.to_log2();
    const float* const lse = tiles.row_floats(slot, 0);
    const float* const dot = tiles.row_floats(slot, 1);
    const int rows_end = min(r0 + Tr::block_m, steps.row_end);
    const bool masked = !tile_in_band(band, r0, rows_end, key0, Tr::block_n);
    const bool edge = r0 + Tr::block_m > seq.seqlen_q || key0 + Tr::block_n > seq.seqlen_k;
    const int query_col = r0 + 2 * (lane % 4);
    const unsigned streamed_v = mma::smem_address(tiles.streamed_v(slot));
    float grad[1][Tr::s_tiles][4];
    backward_step<Tr>(
        dk, own_qk, own_v, mma::smem_address(tiles.streamed_qk(slot)), streamed_v, lanes,
        place.slice,
        [&](float(&s)[1][Tr::s_tiles][4]) {
          transposed_derivatives(grad, s, transform, key_row, query_col);
          if (transform.has_bias && edge) {
            transposed_logits<true>(s, transform, key_row, query_col);
          } else {
            transposed_logits<false>(s, transform, key_row, query_col);
          }
          if (masked) mask_transposed(s, band, key_row, query_col);
          logits_to_probs(s, to_log2,
                          [&](int nt, int e) { return lse[fragment_col(nt, e, lane)]; });
          pv_accumulate<Accumulate<Tr, Tr::v_pitch, Tr::v_slice>>(
              dv, s, streamed_v + lanes.av.v + place.slice * Tr::v_slice * Tr::q_size, lanes.av);
        },
        [&](const float(&prob)[1][Tr::s_tiles][4], float(&dp)[1][Tr::s_tiles][4]) {
          const auto query_dot = [&](int nt, int e) { return dot[fragment_col(nt, e, lane)]; };
          if constexpr (Spec::has_dbias) {
            // The row group's warps all compute its scores: the first slice's writes them.
            if (place.slice == 0) {
              store_transposed_dlogits(dbias_accum_rows(bp, batch, at.head), p.seqlen_k, prob, dp,
                                       query_dot, key_row, tile.stored, query_col, rows_end);
            }
          }
          dp_to_ds(dp, prob, grad, transform, query_dot);
        });
    if (more) store_rows(next, 1 - slot);
  }

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the tiles the gradients are staged in
  stage_fragments<Tr::qk_pitch>(tiles.own_qk(), dk, place.row, place.slice * Tr::qk_slice, lane);
  stage_fragments<Tr::v_pitch>(tiles.own_v(), dv, place.row, place.slice * Tr::v_slice, lane);
  __syncthreads();
  const auto grads = grad_rows<Spec::varlen, T>(bp, batch, tile.head_kv);
  store_tile<Tr::block_n, Tr::head_dim, Tr::qk_pitch, Tr::threads>(
      grads.k + key0 * grads.k_seq_stride, grads.k_seq_stride, tiles.own_qk(), tile.stored - key0,
      thread);
  store_tile<Tr::block_n, Tr::head_dim_v, Tr::v_pitch, Tr::threads>(
      grads.v + key0 * grads.v_seq_stride, grads.v_seq_stride, tiles.own_v(), tile.stored - key0,
      thread);
}

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardMmaTraits<Spec>::threads)
    attention_backward_dq_mma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardMmaTraits<Spec>;
  using T = typename Tr::T;
  const AttentionParams& p = bp.fwd;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  const BackwardMmaTiles<Tr, 0> tiles{smem_bytes};

  const Tile tile = cta_tile<Spec, Tr::block_n, Tr::block_m>(p);
  const Sequence& seq = tile.seq;
  const RowBlock& rows = tile.rows;
  const Band& band = tile.band;
  const KeyBlocks& blocks = tile.blocks;
  if (rows.begin >= rows.end) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32;
  const int lane = thread % 32;

  const T* const dout = static_cast<const T*>(bp.dout) +
                        dout_offset<Spec::varlen>(bp, seq.batch, seq.head) +
                        rows.begin * bp.dout_seq_stride;
  load_tile_async<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
      tiles.own_qk(), static_cast<const T*>(p.q) + seq.q_offset + rows.begin * p.q_seq_stride,
      p.q_seq_stride, rows.end - rows.begin, thread);
  load_tile_async<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, Tr::threads>(
      tiles.own_v(), dout, bp.dout_seq_stride, rows.end - rows.begin, thread);
  const auto kv = sequence_kv<Spec, T>(p, seq);
  const auto load_keys = [&](int block, int slot) {
    const int key0 = block * Tr::block_m;
    load_tile_async<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
        tiles.streamed_qk(slot), kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride,
        seq.seqlen_k - key0, thread);
    load_tile_async<Tr::block_m, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, Tr::threads>(
        tiles.streamed_v(slot), kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride,
        seq.seqlen_k - key0, thread);
  };
  if (blocks.begin < blocks.end) load_keys(blocks.begin, 0);
  mma::cp_async_commit();

  const WarpPlace place = warp_place<Tr>(warp);
  const ProductLanes<Tr> lanes = product_lanes<Tr>(place.row, lane);
  const unsigned own_qk = mma::smem_address(tiles.own_qk());
  const unsigned own_v = mma::smem_address(tiles.own_v());

  // The thread's rows: row0 and row0 + 8; their LSE (log2 units; -inf past the rows, whose
  // probabilities are then 0) and D.
  const int row0 = rows.begin + place.row + lane / 4;
  float lse[2], dot[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + 8 * r;
    lse[r] = row < rows.end ? p.maybe_lse[seq.lse_offset + row] * kLog2e : neg_inf();
    dot[r] = row < rows.end ? bp.row_dot[seq.lse_offset + row] : 0.f;
  }
  const auto transform = make_logit_transform<Spec, mma::ApproxMath, 2>(p, seq, band, row0);
  const float to_log2 = transform.to_log2();

  float dq[1][Tr::qk_slice / 8][4];
  zero_fragments(dq);
  for (int block = blocks.begin; block < blocks.end; ++block) {
    const int slot = (block - blocks.begin) % 2;
    mma::cp_async_wait<0>();
    __syncthreads();  // the slot is visible to all, and every warp is done with the other one
    if (block + 1 < blocks.end) load_keys(block + 1, 1 - slot);
    mma::cp_async_commit();

    const int key0 = block * Tr::block_m + 2 * (lane % 4);
    const bool masked = blocks.needs_mask(block, Tr::block_m);
    float grad[1][Tr::s_tiles][4];
    backward_step<Tr>(
        dq, own_qk, own_v, mma::smem_address(tiles.streamed_qk(slot)),
        mma::smem_address(tiles.streamed_v(slot)), lanes, place.slice,
        [&](float(&s)[1][Tr::s_tiles][4]) {
          logit_derivatives(grad, s, [&](int nt, int x, float score) {
            const int r = x / 2;
            return transform.score_grad(score, transform.rows[r], transform.query(r),
                                        key0 + 8 * nt + x % 2);
          });
          transform.apply(s, key0, masked, [&] { mask_logits(s, band, row0, key0); });
          logits_to_probs(s, to_log2, [&](int, int e) { return lse[e / 2]; });
        },
        [&](const float(&prob)[1][Tr::s_tiles][4], float(&dp)[1][Tr::s_tiles][4]) {
          dp_to_ds(dp, prob, grad, transform, [&](int, int e) { return dot[e / 2]; });
        });
  }

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with the tile dq is staged in
  stage_fragments<Tr::qk_pitch>(tiles.own_qk(), dq, place.row, place.slice * Tr::qk_slice, lane);
  __syncthreads();
  store_tile<Tr::block_n, Tr::head_dim, Tr::qk_pitch, Tr::threads>(
      static_cast<T*>(bp.dq) + dq_offset<Spec::varlen>(bp, seq.batch, seq.head) +
          rows.begin * bp.dq_seq_stride,
      bp.dq_seq_stride, tiles.own_qk(), rows.end - rows.begin, thread);
}

}  // namespace kiln
