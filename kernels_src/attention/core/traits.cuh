// SPDX-License-Identifier: Apache-2.0
// Compile-time shape of the attention kernels: the problem constants every one takes and the
// checks on them, and the shared-memory tile layouts their traits (each kernel's own) choose.
#pragma once

#include "common/prelude.cuh"

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

// Element offset of (row, col) in a tile of Pitch-element rows whose 16-byte chunks hold Chunk
// elements (8 of 2 bytes, 16 of fp8); col a multiple of Chunk.
template <int Pitch, int Swizzle, int Chunk = 8>
__device__ __forceinline__ int tile_offset(int row, int col) {
  return row * Pitch + (Swizzle > 1 ? ((col / Chunk) ^ (row % Swizzle)) * Chunk : col);
}

// Whether T is an fp8 type, kiln::e4m3 or kiln::e5m2.
template <class T>
inline constexpr bool is_fp8 = is_same<T, e4m3>::value || is_same<T, e5m2>::value;

// The problem constants every attention kernel takes, and the checks on them.
// Each operand has its own element type: Q (q), KV (k and v, or the KV cache) and Out (out).
// ReadsFp8: the kernel takes an fp8 KV (e4m3 or e5m2) under a 16-bit q, converting it to Q's type
// as it reads it (fp8.cuh). TakesFp8Q: the kernel also takes q, k and v all in e4m3, its
// products in fp8, with out in f16 or bf16 (the tma kernel's all-fp8 forward).
template <class Spec, bool ReadsFp8 = false, bool TakesFp8Q = false>
struct HeadTraits {
  using Q = typename Spec::dtype_q;
  using KV = typename Spec::dtype_kv;
  using Out = typename Spec::dtype_out;
  static constexpr bool kv_fp8 = is_fp8<KV>;
  static constexpr bool q_fp8 = is_fp8<Q>;
  static_assert(is_same<Q, f16>::value || is_same<Q, bf16>::value ||
                    (TakesFp8Q && is_same<Q, e4m3>::value),
                "dtype_q must be kiln::f16 or kiln::bf16 (or, on the tma kernel, kiln::e4m3).");
  static_assert(q_fp8 ? is_same<Out, f16>::value || is_same<Out, bf16>::value
                      : is_same<Out, Q>::value,
                "dtype_out must be dtype_q, or kiln::f16 or kiln::bf16 under an fp8 q.");
  static_assert(q_fp8 ? is_same<KV, Q>::value : is_same<KV, Q>::value || kv_fp8,
                "dtype_kv must be dtype_q, or kiln::e4m3 or kiln::e5m2 under a 16-bit q.");
  static_assert(ReadsFp8 || !kv_fp8 || q_fp8,
                "dtype_kv must be dtype_q: this kernel reads no fp8 KV.");
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

}  // namespace kiln::attention
