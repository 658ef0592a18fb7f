// SPDX-License-Identifier: Apache-2.0
// A bf16 q over e4m3 k and v on the tma kernel (WgmmaTraits' splits_q): each consumer warpgroup
// turns its 64 rows of the Q tile TMA landed (bf16, 64-column chunks of 128-byte rows, swizzled
// by 128) into two e4m3 terms in the same bytes, so that Q K^T takes fp8 products against K as it
// lands, with no widening of K.
//
// The values are scaled by a power of two first, the same for the warpgroup's rows, that puts
// their largest finite magnitude in [128, 256): then hi = e4m3(x) and lo = e4m3(x - hi) hold x
// exactly (x has 8 significant bits: hi keeps 4, and x - hi is at most 8 units of x's last place,
// which e4m3 holds down to 2^-9) wherever x is 2^-9 of the largest value or more (2^-2 once
// scaled), and within 2^-17 of it below. The softmax scale takes the power's inverse (exact). A NaN
// or infinite value becomes NaN in hi, so that its row's scores are NaN, as a 16-bit product's
// would be. The largest value is taken over all 64 rows, also those past the tile's last (zeros, or
// with varlen the next sequence's q): a sequence's exactness can depend on its neighbour's.
//
// Each 128-byte row of a chunk (64 columns) becomes hi's 64 bytes then lo's, swizzled by 128 as
// before: start_kmajor_product's Terms 2 reads hi and lo against the same 64 columns of K. A
// thread rewrites only the row chunks it read, so the warpgroup meets only to agree on the scale:
// thread t of the warpgroup takes row chunks t, t + 128, ... (row t % 64 of chunk t / 64; at head
// dims to 64 threads 64 to 127 have none), consecutive lanes consecutive rows, so that a
// quarter-warp's 16-byte accesses hit 8 distinct bank groups.
#pragma once

#include "attention/core/fp8.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

namespace kiln {
namespace attention {

template <class Tr>
struct QTerms {
  static_assert(Tr::splits_q && Tr::q_chunk_columns == 64, "a split bf16 q's 64-column chunks.");
  static constexpr int row_chunks = 64 * Tr::q_dim / 64;  // the warpgroup's

  unsigned char* tile;  // the Q tile
  float* amax;          // the warpgroup's 4 warps' largest magnitudes (static shared memory)
  int warpgroup;
  int thread;  // in the warpgroup, 0 to 127

  // Splits the warpgroup's rows; returns the power of two the softmax scale takes (the inverse of
  // theirs). Every thread of the warpgroup, with named barrier `barrier` its own.
  __device__ __forceinline__ float split(int barrier) const {
    float largest = 0.f;
    for (int unit = thread; unit < row_chunks; unit += 128) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 in[4];
        load_half(row_chunk(unit), unit % 8, half, in);
#pragma unroll
        for (int piece = 0; piece < 4; ++piece) {
          const unsigned* const words = &in[piece].x;
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            // A bf16 pair's magnitudes as fp32: their bits in the high halves (NaN and infinity
            // left out, as no finite scale fits them).
            const float a = __uint_as_float((words[w] << 16) & 0x7fffffffu);
            const float b = __uint_as_float(words[w] & 0x7fff0000u);
            if (a < infinity()) largest = fmaxf(largest, a);
            if (b < infinity()) largest = fmaxf(largest, b);
          }
        }
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
    }
    if (thread % 32 == 0) amax[thread / 32] = largest;
    tma::named_sync(barrier, 128);
    largest = fmaxf(fmaxf(amax[0], amax[1]), fmaxf(amax[2], amax[3]));
    // 2^(7 - e) for largest in [2^e, 2^(e + 1)): the largest lands in [128, 256), below e4m3's
    // 448; zero or tiny values take 2^126.
    const int biased = max(static_cast<int>(__float_as_uint(largest) >> 23), 8);
    const float scale = __uint_as_float(static_cast<unsigned>(261 - biased) << 23);
    for (int unit = thread; unit < row_chunks; unit += 128) {
      // Columns 0-31 make pieces 0-1 (hi) and 4-5 (lo), columns 32-63 pieces 2-3 and 6-7: each
      // half is read before the other's terms overwrite it, holding 32 registers at most.
      unsigned char* const row = row_chunk(unit);
      const int swizzle = unit % 8;
      uint4 in[4], first[4];
      load_half(row, swizzle, 0, in);
      terms_of_half(in, scale, first);
      load_half(row, swizzle, 1, in);
      store_half(row, swizzle, 0, first);
      terms_of_half(in, scale, first);
      store_half(row, swizzle, 1, first);
    }
    wgmma::fence_shared_for_async();  // the terms are visible to wgmma's reads
    tma::named_sync(barrier, 128);
    return __uint_as_float(static_cast<unsigned>(biased - 7) << 23);
  }

 private:
  __device__ __forceinline__ static float infinity() {
    return __int_as_float(0x7f800000);
  }

  // Row chunk `unit` of the warpgroup's: its row (unit % 64) of chunk unit / 64.
  __device__ __forceinline__ unsigned char* row_chunk(int unit) const {
    return tile + (unit / 64 * Tr::block_m + warpgroup * 64 + unit % 64) * 128;
  }

  // Half `half` of a row chunk's bf16 values (columns 32 half .. 32 half + 31).
  __device__ __forceinline__ static void load_half(const unsigned char* row, int swizzle, int half,
                                                   uint4 (&in)[4]) {
#pragma unroll
    for (int piece = 0; piece < 4; ++piece) {
      in[piece] = *reinterpret_cast<const uint4*>(row + ((4 * half + piece) ^ swizzle) * 16);
    }
  }

  // The terms of half a row chunk's values: hi's two pieces, then lo's.
  __device__ __forceinline__ static void terms_of_half(const uint4 (&in)[4], float scale,
                                                       uint4 (&out)[4]) {
#pragma unroll
    for (int piece = 0; piece < 4; ++piece) {
      const unsigned* const words = &in[piece].x;
      unsigned* const hi = &out[piece / 2].x + piece % 2 * 2;
      unsigned* const lo = &out[2 + piece / 2].x + piece % 2 * 2;
      terms(words[0], words[1], scale, hi[0], lo[0]);
      terms(words[2], words[3], scale, hi[1], lo[1]);
    }
  }

  // The terms of half `half` of a row chunk: hi's to pieces 2 half, 2 half + 1, lo's 4 past.
  __device__ __forceinline__ static void store_half(unsigned char* row, int swizzle, int half,
                                                    const uint4 (&out)[4]) {
#pragma unroll
    for (int piece = 0; piece < 4; ++piece) {
      const int at = 2 * half + piece % 2 + piece / 2 * 4;
      *reinterpret_cast<uint4*>(row + (at ^ swizzle) * 16) = out[piece];
    }
  }

  // Two bf16 pairs (4 values, the first in the low half of `low`) times `scale` as an e4m3 word
  // of each term.
  __device__ __forceinline__ static void terms(unsigned low, unsigned high, float scale,
                                               unsigned& hi, unsigned& lo) {
    float x[4] = {__uint_as_float(low << 16), __uint_as_float(low & 0xffff0000u),
                  __uint_as_float(high << 16), __uint_as_float(high & 0xffff0000u)};
    bool finite[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      finite[e] = fabsf(x[e]) < infinity();
      x[e] = finite[e] ? x[e] * scale : __int_as_float(0x7fffffff);
    }
    hi = fp8x4_from_floats<e4m3>(x[0], x[1], x[2], x[3]);
    float h[4];
    fp8x2_to_floats<e4m3>(static_cast<unsigned short>(hi & 0xffffu), h[0], h[1]);
    fp8x2_to_floats<e4m3>(static_cast<unsigned short>(hi >> 16), h[2], h[3]);
    lo = fp8x4_from_floats<e4m3>(finite[0] ? x[0] - h[0] : 0.f, finite[1] ? x[1] - h[1] : 0.f,
                                 finite[2] ? x[2] - h[2] : 0.f, finite[3] ? x[3] - h[3] : 0.f);
  }
};

}  // namespace attention
}  // namespace kiln
