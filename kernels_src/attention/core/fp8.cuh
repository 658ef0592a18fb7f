// SPDX-License-Identifier: Apache-2.0
// fp8 tiles (e4m3, e5m2) converted in shared memory to the 16-bit type of the mma operands, whose
// fragments are then read from the converted tile as from any 16-bit one. sm_89 and newer (the
// cvt from fp8 pairs). Exact, NaN kept: every e4m3 and e5m2 value is an f16 value and a bf16
// one.
#pragma once

#include "attention/core/traits.cuh"

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

// Two fp8 values, the first in the low byte, as a pair of T (f16 or bf16), the first low.
template <class T, class KV>
__device__ __forceinline__ unsigned fp8x2_to(unsigned short pair) {
  const unsigned halves = fp8x2_to_f16x2<KV>(pair);
  if constexpr (is_same<T, f16>::value) {
    return halves;
  } else {
    static_assert(is_same<T, bf16>::value, "fp8 converts to kiln::f16 or kiln::bf16.");
    unsigned out;
    asm("{\n"
        ".reg .f16 lo, hi;\n"
        ".reg .f32 flo, fhi;\n"
        "mov.b32 {lo, hi}, %1;\n"
        "cvt.f32.f16 flo, lo;\n"
        "cvt.f32.f16 fhi, hi;\n"
        "cvt.rn.bf16x2.f32 %0, fhi, flo;\n"
        "}\n"
        : "=r"(out)
        : "r"(halves));
    return out;
  }
}

// Four fp8 values (a 32-bit word, the first in the low byte) as two words of T pairs.
template <class T, class KV>
__device__ __forceinline__ uint2 fp8x4_to(unsigned word) {
  return make_uint2(fp8x2_to<T, KV>(static_cast<unsigned short>(word & 0xffffu)),
                    fp8x2_to<T, KV>(static_cast<unsigned short>(word >> 16)));
}

// Converts a tile of Rows rows of Dim KV elements (unpadded rows of 16-byte chunks of 16
// elements, chunk c of row r at chunk c ^ (r % FromSwizzle)) at `from` into the same rows of
// T at `to` (chunks of 8 elements, chunk c of row r at c ^ (r % ToSwizzle)), by Threads threads
// of which this is `thread`. The caller orders the reads before and after it (a barrier).
template <class T, class KV, int Rows, int Dim, int FromSwizzle, int ToSwizzle, int Threads>
__device__ __forceinline__ void convert_fp8_tile(T* to, const KV* from, int thread) {
  static_assert(Dim % 16 == 0, "an fp8 tile's rows are whole 16-byte chunks.");
  constexpr int chunks = Dim / 16;  // per row, of the fp8 tile
  const unsigned char* const from_bytes = reinterpret_cast<const unsigned char*>(from);
  unsigned char* const to_bytes = reinterpret_cast<unsigned char*>(to);
#pragma unroll
  for (int pass = 0; pass < (Rows * chunks + Threads - 1) / Threads; ++pass) {
    const int i = thread + pass * Threads;
    if (Rows * chunks % Threads != 0 && i >= Rows * chunks) break;
    const int row = i / chunks;
    const int c = i % chunks;
    const uint4 in = *reinterpret_cast<const uint4*>(
        from_bytes + row * Dim + (FromSwizzle > 1 ? c ^ (row % FromSwizzle) : c) * 16);
    const uint2 a = fp8x4_to<T, KV>(in.x), b = fp8x4_to<T, KV>(in.y);
    const uint2 d = fp8x4_to<T, KV>(in.z), e = fp8x4_to<T, KV>(in.w);
    unsigned char* const out_row = to_bytes + row * Dim * 2;
    const int low = ToSwizzle > 1 ? (2 * c) ^ (row % ToSwizzle) : 2 * c;
    const int high = ToSwizzle > 1 ? (2 * c + 1) ^ (row % ToSwizzle) : 2 * c + 1;
    *reinterpret_cast<uint4*>(out_row + low * 16) = make_uint4(a.x, a.y, b.x, b.y);
    *reinterpret_cast<uint4*>(out_row + high * 16) = make_uint4(d.x, d.y, e.x, e.y);
  }
}

}  // namespace kiln::attention
