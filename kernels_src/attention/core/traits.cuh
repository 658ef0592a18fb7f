// SPDX-License-Identifier: Apache-2.0
// Compile-time shape of the forward kernels: what a spec's constants imply (tiles, fragments,
// shared-memory layout), and the checks that refuse specs the kernel cannot run.
#pragma once

#include "common/prelude.cuh"
#include "kiln/params/attention.h"

namespace kiln::attention {

__host__ __device__ constexpr int round_up(int x, int multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// Shared-memory row tiles come in two layouts. Padded: rows of Pitch elements with 8 to spare
// (16 bytes), so that the 8 rows an ldmatrix phase reads fall in distinct bank groups.
// Swizzled (Swizzle > 1): unpadded rows whose 16-byte chunk c of row r sits at chunk
// c ^ (r % Swizzle), which spreads those rows as well. Swizzled tiles suit streaming loads: on an
// H200 a cp.async read into 272-byte rows ran at 4.20 TB/s against 4.56 into 256-byte ones, and
// the padded decode kernel passed a third more sectors through L2 than it read from DRAM.
//
// The swizzle of rows of `chunks` 16-byte chunks: the largest power of two dividing it, at most
// 8 (XOR must stay within the row).
__host__ __device__ constexpr int swizzle_for(int chunks) {
  return chunks % 8 == 0 ? 8 : chunks % 4 == 0 ? 4 : chunks % 2 == 0 ? 2 : 1;
}

// Element offset of (row, col) in a tile of Pitch-element rows; col a multiple of 8.
template <int Pitch, int Swizzle>
__device__ __forceinline__ int tile_offset(int row, int col) {
  return row * Pitch + (Swizzle > 1 ? ((col / 8) ^ (row % Swizzle)) * 8 : col);
}

// The problem constants every attention kernel takes, and the checks on them.
// Each operand has its own element type: Q (q), KV (k and v, or the KV cache) and Out (out).
template <class Spec>
struct HeadTraits {
  using Q = typename Spec::dtype_q;
  using KV = typename Spec::dtype_kv;
  using Out = typename Spec::dtype_out;
  static_assert(is_same<Q, f16>::value || is_same<Q, bf16>::value,
                "dtype_q must be kiln::f16 or kiln::bf16.");
  static_assert(is_same<KV, Q>::value && is_same<Out, Q>::value,
                "dtype_kv and dtype_out must be dtype_q: an mma multiplies operands of one type "
                "(fp8 KV caches are not supported yet).");
  // Bytes per element, wherever the kernels compute bytes.
  static constexpr int q_size = static_cast<int>(sizeof(Q));
  static constexpr int kv_size = static_cast<int>(sizeof(KV));
  static constexpr int out_size = static_cast<int>(sizeof(Out));

  static constexpr int head_dim = static_cast<int>(Spec::head_dim);
  static constexpr int head_dim_v = static_cast<int>(Spec::head_dim_v);
  static_assert(head_dim >= 8 && head_dim <= 256 && head_dim % 8 == 0,
                "head_dim must be a multiple of 8 from 8 to 256.");
  static_assert(head_dim_v >= 8 && head_dim_v <= 256 && head_dim_v % 8 == 0,
                "head_dim_v must be a multiple of 8 from 8 to 256.");
};

template <class Spec>
struct ForwardTraits : HeadTraits<Spec> {
  using HeadTraits<Spec>::head_dim;
  using HeadTraits<Spec>::head_dim_v;
  using HeadTraits<Spec>::q_size;
  using HeadTraits<Spec>::kv_size;
  using HeadTraits<Spec>::out_size;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int stages = static_cast<int>(Spec::stages);
  static constexpr int threads = warps * 32;

  static_assert(warps >= 1 && warps <= 16, "warps must be between 1 and 16.");
  static_assert(block_m % (16 * warps) == 0,
                "block_m must be a multiple of 16 * warps: each warp owns whole m16 row tiles.");
  static_assert(block_m / (16 * warps) <= 4, "each warp may own at most 4 m16 row tiles.");
  static_assert(block_n % 16 == 0 && block_n >= 16 && block_n <= 256,
                "block_n must be a multiple of 16 from 16 to 256.");
  static_assert(stages >= 1 && stages <= 4, "stages must be 1, 2, 3 or 4.");

  // The mma consumes k in steps of 16, so the QK^T reduction dim is padded with zeros to 16;
  // the PV output dim too, which keeps ldmatrix.x4 pairs whole (padded columns are not stored).
  static constexpr int qk_dim = round_up(head_dim, 16);
  static constexpr int v_dim = round_up(head_dim_v, 16);
  // Smem rows carry 8 extra elements (16 bytes): with an odd number of 16-byte chunks per row,
  // the 8 rows one ldmatrix phase reads fall in 8 different bank groups.
  static constexpr int qk_pitch = qk_dim + 8;
  static constexpr int v_pitch = v_dim + 8;
  static constexpr int qk_swizzle = 1;  // padded tiles (see tile_offset)
  static constexpr int v_swizzle = 1;

  static constexpr int rows_per_warp = block_m / warps;
  static constexpr int m_tiles = rows_per_warp / 16;  // m16 tiles per warp
  static constexpr int s_tiles = block_n / 8;         // n8 tiles of a score row block
  static constexpr int o_tiles = v_dim / 8;           // n8 tiles of an output row block

  // How many mma steps ahead of use qk_scores and pv_accumulate load ldmatrix fragments (0:
  // just in time). Measured on an H200 (dev notes): one step ahead gains 4-8% at head_dim 128
  // (two m16 tiles per warp), but loses 2-5% at head_dim 64 and does nothing or worse with one
  // m16 tile per warp (head_dim 256).
  static constexpr int prefetch = m_tiles >= 2 && qk_dim > 64 ? 1 : 0;

  // Shared memory: Q (q_elems elements of Q), then `stages` slots of (K tile, V tile), elements
  // of KV. The output is staged from offset 0 once the loop is done.
  static constexpr int q_elems = block_m * qk_pitch;
  static constexpr int k_elems = block_n * qk_pitch;
  static constexpr int v_elems = block_n * v_pitch;
  static constexpr int slot_elems = k_elems + v_elems;
  static constexpr int smem_bytes = static_cast<int>(attention_forward_smem_bytes(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, kv_size, out_size));
  static_assert(smem_bytes >= q_elems * q_size + stages * slot_elems * kv_size &&
                    smem_bytes >= block_m * v_pitch * out_size,
                "attention_forward_smem_bytes disagrees with the kernel's layout.");
  static_assert(smem_bytes <= 227 * 1024,
                "the tiles need more than 227 KiB of shared memory: lower block_m, block_n or "
                "stages.");
};

}  // namespace kiln::attention
