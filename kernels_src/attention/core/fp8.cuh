// SPDX-License-Identifier: Apache-2.0
// fp8 K and V tiles (e4m3, e5m2) as mma operands of Q's 16-bit type: their fragments are read
// from shared memory as fp8, half the bytes a 16-bit tile's take, and widened in registers.
// sm_89 and newer (the cvt from fp8 pairs). Exact, NaN kept: every e4m3 and e5m2 value is an f16
// value and a bf16 one; values dequantized by descales per token (fp8x2_to_scaled) are rounded to
// the 16-bit type once.
//
// ldmatrix reads a tile's bytes in pairs, as b16 elements, so a fragment holds fp8 values in an
// order of its own, which the other operand's order follows:
// - K (the B operand of S = Q K^T): lane (g, t) = (lane / 4, lane % 4) holds key g's head dims
//   4t .. 4t + 3 of each k16 step, where the mma wants 2t, 2t + 1 and 2t + 8, 2t + 9. The
//   product sums over the head dim, so Q's head dims take the same order (permute_q_for_fp8_k)
//   and S comes out as with a 16-bit K.
// - V (the B operand of O += P V, through .trans): lane (g, t) holds keys 2t, 2t + 1 (and
//   +8) of head dims 2g and 2g + 1, which a byte permute splits. The k16 step's keys are P's,
//   as with a 16-bit V; each 16 head dims go to two n8 tiles, the even ones and the odd ones,
//   so that O's accumulators o[mt][2G + h][x] hold head dim 16G + 4t + 2 (x % 2) + h
//   (fp8_o_column).
#pragma once

#include "attention/core/tile_mma.cuh"

namespace kiln::attention {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
constexpr bool kFp8Conversions = false;
#else
constexpr bool kFp8Conversions = true;
#endif

// Two fp8 values, the first in the low byte, as an f16 pair (the first in the low half).
template <class KV>
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned short pair) {
  static_assert(kFp8Conversions || sizeof(KV) == 0,
                "fp8 is converted with instructions of sm_89 and newer.");
  unsigned out;
  if constexpr (is_same<KV, e4m3>::value) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(pair));
  } else {
    static_assert(is_same<KV, e5m2>::value, "an fp8 type: kiln::e4m3 or kiln::e5m2.");
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;\n" : "=r"(out) : "h"(pair));
  }
  return out;
}

// Two fp8 values, the first in the low byte, as fp32 (lo the first).
template <class KV>
__device__ __forceinline__ void fp8x2_to_floats(unsigned short pair, float& lo, float& hi) {
  const unsigned halves = fp8x2_to_f16x2<KV>(pair);
  asm("{\n"
      ".reg .f16 l, h;\n"
      "mov.b32 {l, h}, %2;\n"
      "cvt.f32.f16 %0, l;\n"
      "cvt.f32.f16 %1, h;\n"
      "}\n"
      : "=f"(lo), "=f"(hi)
      : "r"(halves));
}

// Two fp8 values, the first in the low byte, as a pair of T (f16 or bf16), the first low.
template <class T, class KV>
__device__ __forceinline__ unsigned fp8x2_to(unsigned short pair) {
  if constexpr (is_same<T, f16>::value) {
    return fp8x2_to_f16x2<KV>(pair);
  } else {
    static_assert(is_same<T, bf16>::value, "fp8 converts to kiln::f16 or kiln::bf16.");
    float lo, hi;
    fp8x2_to_floats<KV>(pair, lo, hi);
    return mma::pack2<T>(lo, hi);
  }
}

// As fp8x2_to, the values times scale.x (the first) and scale.y in fp32, rounded to T once:
// dequantized as the plain computation would dequantize them into T.
template <class T, class KV>
__device__ __forceinline__ unsigned fp8x2_to_scaled(unsigned short pair, float2 scale) {
  float lo, hi;
  fp8x2_to_floats<KV>(pair, lo, hi);
  return mma::pack2<T>(lo * scale.x, hi * scale.y);
}

// x rounded to the nearest value of KV (kiln::e4m3 or kiln::e5m2), saturating to its largest
// finite one (448 or 57344, signed); NaN stays NaN.
template <class KV>
__device__ __forceinline__ KV fp8_from_float(float x) {
  static_assert(kFp8Conversions || sizeof(KV) == 0,
                "fp8 is converted with instructions of sm_89 and newer.");
  unsigned short pair;  // x in the low byte
  if constexpr (is_same<KV, e4m3>::value) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(0.f), "f"(x));
  } else {
    static_assert(is_same<KV, e5m2>::value, "an fp8 type: kiln::e4m3 or kiln::e5m2.");
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\n" : "=h"(pair) : "f"(0.f), "f"(x));
  }
  return {static_cast<unsigned char>(pair & 0xffu)};
}

// a, b, c and d rounded to T (kiln::e4m3 or kiln::e5m2) as fp8_from_float does, packed from the
// low byte up: an fp8 mma fragment register.
template <class T>
__device__ __forceinline__ unsigned fp8x4_from_floats(float a, float b, float c, float d) {
  static_assert(kFp8Conversions || sizeof(T) == 0,
                "fp8 is converted with instructions of sm_89 and newer.");
  unsigned out;
  if constexpr (is_same<T, e4m3>::value) {
    asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\nmov.b32 %0, {lo, hi};\n}\n"
        : "=r"(out)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  } else {
    static_assert(is_same<T, e5m2>::value, "an fp8 type: kiln::e4m3 or kiln::e5m2.");
    asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\nmov.b32 %0, {lo, hi};\n}\n"
        : "=r"(out)
        : "f"(a), "f"(b), "f"(c), "f"(d));
  }
  return out;
}

// The largest finite value of KV (kiln::e4m3 or kiln::e5m2): 448 or 57344.
template <class KV>
__device__ __forceinline__ constexpr float fp8_largest() {
  return is_same<KV, e4m3>::value ? 448.f : 57344.f;
}

// The descale of a row of new keys (or values) whose largest magnitude is `largest`, so that the
// row fills KV's range: largest / (fp8_largest * head_descale), rounded in fp32 as written. 1
// where that is not finite and positive (a row of zeros, or of values too small for fp32).
template <class KV>
__device__ __forceinline__ float row_descale(float largest, float head_descale) {
  const float descale = __fdiv_rn(largest, __fmul_rn(fp8_largest<KV>(), head_descale));
  constexpr float fp32_largest = 3.40282347e38f;
  return descale > 0.f && descale <= fp32_largest ? descale : 1.f;
}

// Multiplies each column of s (a lane's S fragments: key 8j + 2 (lane % 4) + e % 2 of the tile
// in s[mt][j][e]) by that key's entry of `descales`, the tile's block_n fp32 values in shared
// memory.
template <class Tr>
__device__ __forceinline__ void scale_key_columns(float (&s)[Tr::m_tiles][Tr::s_tiles][4],
                                                  const float* descales, int lane) {
#pragma unroll
  for (int j = 0; j < Tr::s_tiles; ++j) {
    const float2 d = *reinterpret_cast<const float2*>(descales + 8 * j + 2 * (lane % 4));
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt) {
      s[mt][j][0] *= d.x;
      s[mt][j][1] *= d.y;
      s[mt][j][2] *= d.x;
      s[mt][j][3] *= d.y;
    }
  }
}

// Four fp8 values (a 32-bit word, the first in the low byte) as two words of T pairs.
template <class T, class KV>
__device__ __forceinline__ uint2 fp8x4_to(unsigned word) {
  return make_uint2(fp8x2_to<T, KV>(static_cast<unsigned short>(word & 0xffffu)),
                    fp8x2_to<T, KV>(static_cast<unsigned short>(word >> 16)));
}

// As fp8x4_to, each pair times `scale` (fp8x2_to_scaled).
template <class T, class KV>
__device__ __forceinline__ uint2 fp8x4_to_scaled(unsigned word, float2 scale) {
  return make_uint2(fp8x2_to_scaled<T, KV>(static_cast<unsigned short>(word & 0xffffu), scale),
                    fp8x2_to_scaled<T, KV>(static_cast<unsigned short>(word >> 16), scale));
}

// Puts each 16 head dims of Q's rows in shared memory (a tile as lane_offsets reads it: rows of
// qk_pitch elements, qk_swizzle) into the order of an fp8 K's fragments: pairs 0, 2, 4, 6, then
// 1, 3, 5, 7. By every thread of the CTA (Threads), after Q has landed and before the first
// product; the caller orders the two (barriers).
template <class Tr, int Rows, int Threads>
__device__ __forceinline__ void permute_q_for_fp8_k(typename Tr::Q* smem_q, int thread) {
  constexpr int groups = Tr::qk_dim / 16;  // per row
#pragma unroll 1
  for (int i = thread; i < Rows * groups; i += Threads) {
    const int row = i / groups;
    const int col = i % groups * 16;
    uint4* const low =
        reinterpret_cast<uint4*>(smem_q + tile_offset<Tr::qk_pitch, Tr::qk_swizzle>(row, col));
    uint4* const high =
        reinterpret_cast<uint4*>(smem_q + tile_offset<Tr::qk_pitch, Tr::qk_swizzle>(row, col + 8));
    const uint4 a = *low, b = *high;
    *low = make_uint4(a.x, a.z, b.x, b.z);
    *high = make_uint4(a.y, a.w, b.y, b.w);
  }
}

// The head dim (of V, and of the output) that accumulator o[mt][j][x] of a lane holds after
// pv_accumulate_fp8; see the top of this file.
__device__ __forceinline__ int fp8_o_column(int j, int x, int lane) {
  return 16 * (j / 2) + 4 * (lane % 4) + 2 * (x % 2) + j % 2;
}

// As stage_fragments (tile_mma.cuh), for accumulators in fp8_o_column's order: tiles 2G and
// 2G + 1 together hold 4 head dims in a row from 16G + 4 (lane % 4), stored as one 8-byte piece.
template <int Pitch, class T, int MTiles, int Tiles>
__device__ __forceinline__ void stage_fp8_fragments(T* smem, const float (&acc)[MTiles][Tiles][4],
                                                    int row0, int lane) {
  static_assert(Tiles % 2 == 0, "fp8 V's n8 tiles come in pairs (16 head dims).");
#pragma unroll
  for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + half * 8 + lane / 4;
      const int x = 2 * half;
#pragma unroll
      for (int j = 0; j < Tiles; j += 2) {
        *reinterpret_cast<uint2*>(smem + row * Pitch + fp8_o_column(j, 0, lane)) =
            make_uint2(mma::pack2<T>(acc[mt][j][x], acc[mt][j + 1][x]),
                       mma::pack2<T>(acc[mt][j][x + 1], acc[mt][j + 1][x + 1]));
      }
    }
  }
}

// Byte offsets of this lane's ldmatrix row in an fp8 tile of Dim-byte rows (swizzled by
// Swizzle 16-byte chunks), and of its chunk among the first two: keys
// lane % 8 + 8 * (lane / 8 % 2), chunk lane / 16 (pair) or 0 (single, a last odd chunk).
struct Fp8LaneOffsets {
  unsigned row, pair, single;
};

template <int Dim, int Swizzle>
__device__ __forceinline__ Fp8LaneOffsets fp8_lane_offsets(int lane) {
  const int key = lane % 8 + 8 * (lane / 8 % 2);
  return {static_cast<unsigned>(key * Dim),
          static_cast<unsigned>(tile_offset<0, Swizzle, 16>(key, 16 * (lane / 16))),
          static_cast<unsigned>(tile_offset<0, Swizzle, 16>(key, 0))};
}

// The four b16 matrices of 16-byte chunks `chunk` and `chunk` + 1 (a pair; chunk even) of the
// rows of keys key0 .. key0 + 15 of an fp8 tile: keys 0-7 and 8-15 of the first, then of the
// second. A chunk of K is a k16 step's head dims, one of V two n8 tiles'. A single chunk (the last
// of an odd count, in an unswizzled tile) loads its two matrices twice, keeping every lane's
// address inside its row.
template <int Dim, int Swizzle, bool Trans>
__device__ __forceinline__ void load_fp8_pair(unsigned (&r)[4], unsigned tile,
                                              const Fp8LaneOffsets& off, int key0, int chunk,
                                              bool pair) {
  const unsigned address =
      tile + key0 * Dim + off.row + chunk_bytes<Swizzle>(16 * chunk, pair ? off.pair : off.single);
  if constexpr (Trans) {
    mma::ldmatrix_x4_trans(r, address);
  } else {
    mma::ldmatrix_x4(r, address);
  }
}

// s = Q K^T as qk_scores, K an fp8 tile (Tr::KV; rows of qk_dim bytes, kv_qk_swizzle) at shared
// address k_tile, Q's head dims in permute_q_for_fp8_k's order.
template <class Tr>
__device__ __forceinline__ void qk_scores_fp8(float (&s)[Tr::m_tiles][Tr::s_tiles][4],
                                              unsigned q_lane, unsigned k_tile,
                                              const LaneOffsets& lanes, int lane) {
  using Q = typename Tr::Q;
  constexpr int q_row_bytes = Tr::qk_pitch * Tr::q_size;
  constexpr int steps = Tr::qk_dim / 16;
  const Fp8LaneOffsets k = fp8_lane_offsets<Tr::qk_dim, Tr::kv_qk_swizzle>(lane);
  zero_fragments(s);
#pragma unroll
  for (int kk = 0; kk < steps; kk += 2) {
    unsigned a[2][Tr::m_tiles][4];
#pragma unroll
    for (int h = 0; h < 2 && kk + h < steps; ++h) {
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::ldmatrix_x4(a[h][mt], q_lane + mt * 16 * q_row_bytes +
                                       chunk_bytes<Tr::qk_swizzle>((kk + h) * 32, lanes.q_x));
      }
    }
#pragma unroll
    for (int np = 0; np < Tr::s_tiles / 2; ++np) {
      unsigned r[4];
      load_fp8_pair<Tr::qk_dim, Tr::kv_qk_swizzle, false>(r, k_tile, k, 16 * np, kk,
                                                          kk + 1 < steps);
#pragma unroll
      for (int h = 0; h < 2 && kk + h < steps; ++h) {
        const uint2 keys_low = fp8x4_to<Q, typename Tr::KV>(r[2 * h]);
        const uint2 keys_high = fp8x4_to<Q, typename Tr::KV>(r[2 * h + 1]);
#pragma unroll
        for (int mt = 0; mt < Tr::m_tiles; ++mt) {
          mma::mma_16816<Q>(s[mt][2 * np], a[h][mt], keys_low.x, keys_low.y);
          mma::mma_16816<Q>(s[mt][2 * np + 1], a[h][mt], keys_high.x, keys_high.y);
        }
      }
    }
  }
}

// o += P V as pv_accumulate, V an fp8 tile (rows of v_dim bytes, kv_v_swizzle) at shared address
// v_tile; o's columns in fp8_o_column's order. With Scaled, each key's values are dequantized by
// its entry of `descales` (the tile's block_n fp32 values in shared memory) times `head`, rounded
// to Q's type once (fp8x2_to_scaled).
template <class Tr, bool Scaled = false>
__device__ __forceinline__ void pv_accumulate_fp8(float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                                  const float (&s)[Tr::m_tiles][Tr::s_tiles][4],
                                                  unsigned v_tile, int lane,
                                                  const float* descales = nullptr,
                                                  float head = 1.f) {
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  constexpr int groups = Tr::v_dim / 16;  // of 16 head dims, two n8 tiles each
  const Fp8LaneOffsets v = fp8_lane_offsets<Tr::v_dim, Tr::kv_v_swizzle>(lane);
#pragma unroll
  for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
    unsigned a[Tr::m_tiles][4];
    p_fragments<Q>(a, s, kk);
    // The descales of keys 2t, 2t + 1 and of keys 2t + 8, 2t + 9 of the k16 step.
    float2 low_scale{}, high_scale{};
    if constexpr (Scaled) {
      const float* const step = descales + 16 * kk + 2 * (lane % 4);
      low_scale = *reinterpret_cast<const float2*>(step);
      high_scale = *reinterpret_cast<const float2*>(step + 8);
      low_scale = make_float2(low_scale.x * head, low_scale.y * head);
      high_scale = make_float2(high_scale.x * head, high_scale.y * head);
    }
#pragma unroll
    for (int G = 0; G < groups; G += 2) {
      unsigned r[4];
      load_fp8_pair<Tr::v_dim, Tr::kv_v_swizzle, true>(r, v_tile, v, 16 * kk, G, G + 1 < groups);
#pragma unroll
      for (int h = 0; h < 2 && G + h < groups; ++h) {
        // Keys 2t, 2t + 1 (then + 8) of head dims 2g (low half) and 2g + 1 (high half).
        const unsigned low_keys = __byte_perm(r[2 * h], 0, 0x3120);
        const unsigned high_keys = __byte_perm(r[2 * h + 1], 0, 0x3120);
        uint2 low, high;
        if constexpr (Scaled) {
          low = fp8x4_to_scaled<Q, KV>(low_keys, low_scale);
          high = fp8x4_to_scaled<Q, KV>(high_keys, high_scale);
        } else {
          low = fp8x4_to<Q, KV>(low_keys);
          high = fp8x4_to<Q, KV>(high_keys);
        }
#pragma unroll
        for (int mt = 0; mt < Tr::m_tiles; ++mt) {
          mma::mma_16816<Q>(o[mt][2 * (G + h)], a[mt], low.x, high.x);
          mma::mma_16816<Q>(o[mt][2 * (G + h) + 1], a[mt], low.y, high.y);
        }
      }
    }
  }
}

}  // namespace kiln::attention
