// SPDX-License-Identifier: Apache-2.0
// The two tensor-core products of an attention step for one warp's m16 row tiles, over tiles in
// shared memory: scores S = Q K^T and the output update O += P V. Shared by the forward and
// decode kernels; Tr (their traits) gives Q, KV, q_size, kv_size (HeadTraits),
// m_tiles, s_tiles, o_tiles, qk_dim, qk_pitch, v_pitch, qk_swizzle, v_swizzle (the tile layouts of
// traits.cuh), block_n and prefetch.
#pragma once

#include "attention/core/traits.cuh"
#include "common/mma.cuh"

namespace kiln::attention {

// Shared-memory byte addresses each lane hands ldmatrix, relative to its tile's start, as the
// start of the lane's row (q, k, v) and its chunk within the row (q_x, k_x, v_x: the byte
// offset of the lane's 16-byte chunk in the row's first k16 step, which chunk_bytes moves):
// Q (A operand, row-major m16k16): rows first_q_row + lane % 16, columns 8 * (lane / 16).
// K (B operand, keys as n): keys lane % 8 + 8 * (lane / 16), columns 8 * (lane / 8 % 2).
// V (B operand through .trans, keys as k): keys lane % 16, columns 8 * (lane / 16).
// Row blocks an mma step adds (16 rows) leave row % 8, and so the swizzle, unchanged.
struct LaneOffsets {
  unsigned q, q_x;
  unsigned k, k_x;
  unsigned v, v_x;
};

template <class Tr>
__device__ __forceinline__ LaneOffsets lane_offsets(int first_q_row, int lane) {
  const int q_row = first_q_row + lane % 16;
  const int k_row = lane % 8 + 8 * (lane / 16);
  const int v_row = lane % 16;
  LaneOffsets off;
  off.q = Tr::q_size * q_row * Tr::qk_pitch;
  off.q_x = Tr::q_size * tile_offset<0, Tr::qk_swizzle>(q_row, 8 * (lane / 16));
  off.k = Tr::kv_size * k_row * Tr::qk_pitch;
  off.k_x = Tr::kv_size * tile_offset<0, Tr::qk_swizzle>(k_row, 8 * (lane / 8 % 2));
  off.v = Tr::kv_size * v_row * Tr::v_pitch;
  off.v_x = Tr::kv_size * tile_offset<0, Tr::v_swizzle>(v_row, 8 * (lane / 16));
  return off;
}

// Byte offset within a row of the chunk `step_bytes` (a multiple of 32: whole k16 steps) past
// the lane's chunk x: plain addition in padded tiles, where the compiler folds the constant into
// the address; XOR in swizzled ones (x only flips the chunk index's low bits).
template <int Swizzle>
__device__ __forceinline__ unsigned chunk_bytes(unsigned step_bytes, unsigned x) {
  return Swizzle > 1 ? step_bytes ^ x : step_bytes + x;
}

// Sets every element of a fragment accumulator (scores or outputs) to 0.
template <int MTiles, int Tiles>
__device__ __forceinline__ void zero_fragments(float (&acc)[MTiles][Tiles][4]) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Tiles; ++j) {
#pragma unroll
      for (int x = 0; x < 4; ++x) acc[mt][j][x] = 0.f;
    }
  }
}

// Writes a warp's fp32 accumulator tiles, rounded to T, into a shared-memory tile of
// Pitch-element rows: m16 tile mt's rows from row0 + 16 mt, n8 tile j's columns from col0 + 8 j.
template <int Pitch, class T, int MTiles, int Tiles>
__device__ __forceinline__ void stage_fragments(T* smem, const float (&acc)[MTiles][Tiles][4],
                                                int row0, int col0, int lane) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + half * 8 + lane / 4;
#pragma unroll
      for (int j = 0; j < Tiles; ++j) {
        const int col = col0 + j * 8 + 2 * (lane % 4);
        *reinterpret_cast<unsigned*>(smem + row * Pitch + col) =
            mma::pack2<T>(acc[mt][j][2 * half], acc[mt][j][2 * half + 1]);
      }
    }
  }
}

// s = Q K^T for the warp's rows and one K tile. q_lane and k_lane are this lane's ldmatrix row
// addresses (see lane_offsets). Step i of the (kk, np) loop loads its fragments Tr::prefetch
// steps early, into register rings.
template <class Tr>
__device__ __forceinline__ void qk_scores(float (&s)[Tr::m_tiles][Tr::s_tiles][4], unsigned q_lane,
                                          unsigned k_lane, const LaneOffsets& lanes) {
  constexpr int q_row_bytes = Tr::qk_pitch * Tr::q_size;
  static_assert(!Tr::kv_fp8, "an fp8 K goes through qk_scores_fp8 (fp8.cuh).");
  constexpr int k_row_bytes = Tr::qk_pitch * Tr::kv_size;
  zero_fragments(s);
  constexpr int np_count = Tr::s_tiles / 2;
  constexpr int steps = Tr::qk_dim / 16 * np_count;
  constexpr int a_ring = (Tr::prefetch + np_count - 1) / np_count + 1;
  constexpr int b_ring = Tr::prefetch + 1;
  unsigned a[a_ring][Tr::m_tiles][4];
  unsigned b[b_ring][4];
  auto load = [&](int i) {
    const int kk = i / np_count, np = i % np_count;
    if (np == 0) {
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::ldmatrix_x4(a[kk % a_ring][mt], q_lane + mt * 16 * q_row_bytes +
                                                 chunk_bytes<Tr::qk_swizzle>(kk * 32, lanes.q_x));
      }
    }
    mma::ldmatrix_x4(b[i % b_ring], k_lane + np * 16 * k_row_bytes +
                                        chunk_bytes<Tr::qk_swizzle>(kk * 32, lanes.k_x));
  };
#pragma unroll
  for (int i = 0; i < Tr::prefetch; ++i) load(i);
    // NOTE: nested loops rather than one over i: at head_dim 256 the flat loop was left partly
    // rolled, and the rings went to local memory.
#pragma unroll
  for (int kk = 0; kk < Tr::qk_dim / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < np_count; ++np) {
      const int i = kk * np_count + np;
      if (i + Tr::prefetch < steps) load(i + Tr::prefetch);
      const unsigned(&b_i)[4] = b[i % b_ring];
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::mma_16816<typename Tr::Q>(s[mt][2 * np], a[kk % a_ring][mt], b_i[0], b_i[1]);
        mma::mma_16816<typename Tr::Q>(s[mt][2 * np + 1], a[kk % a_ring][mt], b_i[2], b_i[3]);
      }
    }
  }
}

// The A fragments of k16 step kk of P, the probabilities left in s, rounded to T: an m16n8
// accumulator pair (n8 tiles 2kk, 2kk+1) is exactly the A fragment of a k16 step, so P goes from
// registers to the mma unshuffled.
template <class T, int MTiles, int STiles>
__device__ __forceinline__ void p_fragments(unsigned (&a)[MTiles][4],
                                            const float (&s)[MTiles][STiles][4], int kk) {
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
    a[mt][0] = mma::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
    a[mt][1] = mma::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
    a[mt][2] = mma::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
    a[mt][3] = mma::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
  }
}

// o += P V, with P the probabilities left in s (p_fragments). V fragments are loaded Tr::prefetch
// (kk, dp) steps early, as in qk_scores.
template <class Tr>
__device__ __forceinline__ void pv_accumulate(float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                              const float (&s)[Tr::m_tiles][Tr::s_tiles][4],
                                              unsigned v_lane, const LaneOffsets& lanes) {
  static_assert(!Tr::kv_fp8, "an fp8 V goes through pv_accumulate_fp8 (fp8.cuh).");
  using KV = typename Tr::KV;  // P is rounded to V's type
  constexpr int row_bytes = Tr::v_pitch * Tr::kv_size;
  constexpr int dp_count = Tr::o_tiles / 2;
  constexpr int steps = Tr::block_n / 16 * dp_count;
  constexpr int b_ring = Tr::prefetch + 1;
  unsigned b[b_ring][4];
  auto load = [&](int i) {
    const int kk = i / dp_count, dp = i % dp_count;
    mma::ldmatrix_x4_trans(b[i % b_ring], v_lane + kk * 16 * row_bytes +
                                              chunk_bytes<Tr::v_swizzle>(dp * 32, lanes.v_x));
  };
#pragma unroll
  for (int i = 0; i < Tr::prefetch; ++i) load(i);
#pragma unroll
  for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
    unsigned a[Tr::m_tiles][4];
    p_fragments<KV>(a, s, kk);
#pragma unroll
    for (int dp = 0; dp < dp_count; ++dp) {
      const int i = kk * dp_count + dp;
      if (i + Tr::prefetch < steps) load(i + Tr::prefetch);
      const unsigned(&b_i)[4] = b[i % b_ring];
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::mma_16816<KV>(o[mt][2 * dp], a[mt], b_i[0], b_i[1]);
        mma::mma_16816<KV>(o[mt][2 * dp + 1], a[mt], b_i[2], b_i[3]);
      }
    }
  }
}

}  // namespace kiln::attention
