// SPDX-License-Identifier: Apache-2.0
// PTX wrappers for Hopper's warpgroup MMA (sm_90a): wgmma.mma_async with fp32 accumulators,
// m64nNk16 over f16 or bf16 operands and m64nNk32 over fp8 ones (e4m3, e5m2), its fences and
// groups, and the shared-memory matrix descriptors of the 128-byte-swizzled tiles it reads.
//
// Tile layout (every operand in shared memory): a tile of R rows is cut into column chunks of
// 128 bytes (64 16-bit elements, 128 fp8 ones); chunk c is R rows of 128 bytes at
// tile + c * R * 128, and the 16-byte piece p of row r sits at piece p ^ (r % 8) of that row.
// Either way a k step reads 32 bytes of each row. Tiles start 1024-byte aligned, so the
// hardware's swizzle (address bits 4-6 xor bits 7-9) is exactly this one. fp8 Q and K at head
// dims to 64 take the 64-byte swizzle instead (descriptor()'s layout 2): chunks of 64 bytes,
// piece p of row r at piece p ^ (r / 2 % 4), 8 rows 512 bytes apart.
#pragma once

#include "common/prelude.cuh"

namespace kiln::wgmma {

// Where 16-byte piece `piece` (of 8 elements) of row `row` lies in a swizzled tile of `rows` rows.
__device__ __forceinline__ unsigned swizzled_offset(int rows, int row, int piece) {
  return static_cast<unsigned>((piece / 8) * rows * 128 + row * 128 + ((piece ^ row) % 8) * 16);
}

// The descriptor of a swizzled operand at shared address `address`: `swizzle` is the layout
// field, 1 for 128-byte rows, 2 for 64-byte ones. K-major operands (Q and K, reduction dim
// contiguous) step 8 rows by `stride_bytes` (8 rows' bytes) and ignore `leading_bytes`; N-major
// ones (V, output dim contiguous) step 8 reduction rows by `stride_bytes` and 64 output columns
// by `leading_bytes`.
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading_bytes,
                                                         unsigned stride_bytes,
                                                         unsigned long long swizzle = 1) {
  return static_cast<unsigned long long>((address & 0x3FFFFu) >> 4) |
         static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
         static_cast<unsigned long long>(stride_bytes >> 4) << 32 | swizzle << 62;
}

// The descriptor of the operand `offset` bytes past the one `base` describes. The address field
// (bits 0-13, in 16-byte units) never carries: shared memory ends below 2^18 bytes. One 32-bit add
// where descriptor() would mask, shift and merge again.
__device__ __forceinline__ unsigned long long advance(unsigned long long base, unsigned offset) {
  const unsigned low = static_cast<unsigned>(base) + (offset >> 4);
  return (base & 0xFFFFFFFF00000000ull) | low;
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next
// wgmma reads them.
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most Pending of the warpgroup's committed wgmma groups are in flight.
template <int Pending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// Makes this thread's generic-proxy shared-memory writes (cp.async included, once waited for)
// visible to wgmma, which reads through the async proxy. Follow it with a barrier.
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Keeps the compiler from moving reads or writes of accumulators across a wait.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// An m64nNk16 accumulator, N / 2 floats per thread: its registers as PTX operands %0.. and the
// bindings of d[0 .. N / 2) to them.
#define KILN_WGMMA_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define KILN_WGMMA_R32                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KILN_WGMMA_R64                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define KILN_WGMMA_R88                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "  \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}"
#define KILN_WGMMA_R96                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "  \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "  \
  "%92, %93, %94, %95}"
#define KILN_WGMMA_R128                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127}"
#define KILN_WGMMA_F8(i)                                                                \
  "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), "+f"(d[(i) + 4]), \
      "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define KILN_WGMMA_F32(i) \
  KILN_WGMMA_F8(i), KILN_WGMMA_F8((i) + 8), KILN_WGMMA_F8((i) + 16), KILN_WGMMA_F8((i) + 24)
#define KILN_WGMMA_F64 KILN_WGMMA_F32(0), KILN_WGMMA_F32(32)
#define KILN_WGMMA_F88 KILN_WGMMA_F64, KILN_WGMMA_F8(64), KILN_WGMMA_F8(72), KILN_WGMMA_F8(80)
#define KILN_WGMMA_F96 KILN_WGMMA_F64, KILN_WGMMA_F32(64)
#define KILN_WGMMA_F128 KILN_WGMMA_F96, KILN_WGMMA_F32(96)

// The operands after the accumulator's f: for A in shared memory a, b, accumulate, TransposeB;
// for A in registers a[0..3], then the same.
#define KILN_WGMMA_SS(type, n, f, a_, b_, p_, t_, ta_)                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p_                                            \
               ", 0;\n"                                                                            \
               "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." type "." type " " KILN_WGMMA_R##f \
               ", %" #a_ ", %" #b_ ", p, 1, 1, %" #ta_ ", %" #t_ ";\n}\n"                          \
               : KILN_WGMMA_F_##f                                                                  \
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TransposeB ? 1 : 0),       \
                 "n"(TransposeA ? 1 : 0))
#define KILN_WGMMA_RS(type, n, f, a0, a1, a2, a3, b_, p_, t_)                                      \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p_                                            \
               ", 0;\n"                                                                            \
               "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32." type "." type " " KILN_WGMMA_R##f \
               ", {%" #a0 ", %" #a1 ", %" #a2 ", %" #a3 "}, %" #b_ ", p, 1, 1, %" #t_ ";\n}\n"     \
               : KILN_WGMMA_F_##f                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),                               \
                 "r"(static_cast<int>(accumulate)), "n"(TransposeB ? 1 : 0))
// fp8's k32 forms, which take no transposes: both operands K-major.
#define KILN_WGMMA_SS8(type, n, f, a_, b_, p_, t_, ta_)                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p_                                            \
               ", 0;\n"                                                                            \
               "wgmma.mma_async.sync.aligned.m64n" #n "k32.f32." type "." type " " KILN_WGMMA_R##f \
               ", %" #a_ ", %" #b_ ", p, 1, 1;\n}\n"                                               \
               : KILN_WGMMA_F_##f                                                                  \
               : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)))
#define KILN_WGMMA_RS8(type, n, f, a0, a1, a2, a3, b_, p_, t_)                                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #p_                                            \
               ", 0;\n"                                                                            \
               "wgmma.mma_async.sync.aligned.m64n" #n "k32.f32." type "." type " " KILN_WGMMA_R##f \
               ", {%" #a0 ", %" #a1 ", %" #a2 ", %" #a3 "}, %" #b_ ", p, 1, 1;\n}\n"               \
               : KILN_WGMMA_F_##f                                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b),                               \
                 "r"(static_cast<int>(accumulate)))
#define KILN_WGMMA_F_16 KILN_WGMMA_F8(0), KILN_WGMMA_F8(8)
#define KILN_WGMMA_F_32 KILN_WGMMA_F32(0)
#define KILN_WGMMA_F_64 KILN_WGMMA_F64
#define KILN_WGMMA_F_88 KILN_WGMMA_F88
#define KILN_WGMMA_F_96 KILN_WGMMA_F96
#define KILN_WGMMA_F_128 KILN_WGMMA_F128
#define KILN_WGMMA_TYPED(op, ...)                 \
  if constexpr (is_same<T, f16>::value) {         \
    op("f16", __VA_ARGS__);                       \
  } else if constexpr (is_same<T, bf16>::value) { \
    op("bf16", __VA_ARGS__);                      \
  } else if constexpr (is_same<T, e4m3>::value) { \
    op##8("e4m3", __VA_ARGS__);                   \
  } else {                                        \
    op##8("e5m2", __VA_ARGS__);                   \
  }

// The operand types wgmma takes: 16-bit ones (k16 steps) and fp8 ones (k32, both operands
// K-major).
template <class T>
inline constexpr bool takes_operand = is_same<T, f16>::value || is_same<T, bf16>::value ||
                                      is_same<T, e4m3>::value || is_same<T, e5m2>::value;
template <class T>
inline constexpr bool fp8_operand = is_same<T, e4m3>::value || is_same<T, e5m2>::value;

// d (+)= A * B for a 64xK A and a KxN B (K 16 over 16-bit operands, 32 over fp8; N 32, 64, 128,
// 176, 192 or 256), both from shared memory (descriptors a and b); accumulate false overwrites d.
// A is K-major (the reduction dim contiguous) unless TransposeA, where it is M-major: described
// as an N-major B is. fp8 operands are both K-major. Thread t of the
// warpgroup holds, with w = t / 32, g = t % 32 / 4, q = t % 4: d[4j + e] = D(16w + g, 8j + 2q + e),
// d[4j + 2 + e] = D(16w + g + 8, 8j + 2q + e), the mma.sync m16n8 accumulator layout per warp,
// so n8 tiles j of one wide product are those of narrower ones side by side.
template <class T, bool TransposeB, int N, bool TransposeA = false>
__device__ __forceinline__ void mma_ss(float (&d)[N / 2], unsigned long long a,
                                       unsigned long long b, bool accumulate) {
  static_assert(takes_operand<T>, "wgmma takes f16, bf16, e4m3 or e5m2 operands.");
  static_assert(!fp8_operand<T> || (!TransposeA && !TransposeB), "fp8 operands are K-major.");
  static_assert(N == 32 || N == 64 || N == 128 || N == 176 || N == 192 || N == 256,
                "N must be 32, 64, 128, 176, 192 or 256.");
  if constexpr (N == 32) {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 32, 16, 16, 17, 18, 19, 20)
  } else if constexpr (N == 64) {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 64, 32, 32, 33, 34, 35, 36)
  } else if constexpr (N == 128) {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 128, 64, 64, 65, 66, 67, 68)
  } else if constexpr (N == 176) {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 176, 88, 88, 89, 90, 91, 92)
  } else if constexpr (N == 192) {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 192, 96, 96, 97, 98, 99, 100)
  } else {
    KILN_WGMMA_TYPED(KILN_WGMMA_SS, 256, 128, 128, 129, 130, 131, 132)
  }
}

// As mma_ss with A from registers, in mma.sync's A-fragment layout per warp (rows 16w..16w + 15
// of the 64): m16n8k16's over 16-bit operands, m16n8k32's over fp8.
template <class T, bool TransposeB, int N>
__device__ __forceinline__ void mma_rs(float (&d)[N / 2], const unsigned (&a)[4],
                                       unsigned long long b, bool accumulate) {
  static_assert(takes_operand<T>, "wgmma takes f16, bf16, e4m3 or e5m2 operands.");
  static_assert(!fp8_operand<T> || !TransposeB, "fp8 operands are K-major.");
  static_assert(N == 64 || N == 128 || N == 192 || N == 256, "N must be 64, 128, 192 or 256.");
  if constexpr (N == 64) {
    KILN_WGMMA_TYPED(KILN_WGMMA_RS, 64, 32, 32, 33, 34, 35, 36, 37, 38)
  } else if constexpr (N == 128) {
    KILN_WGMMA_TYPED(KILN_WGMMA_RS, 128, 64, 64, 65, 66, 67, 68, 69, 70)
  } else if constexpr (N == 192) {
    KILN_WGMMA_TYPED(KILN_WGMMA_RS, 192, 96, 96, 97, 98, 99, 100, 101, 102)
  } else {
    KILN_WGMMA_TYPED(KILN_WGMMA_RS, 256, 128, 128, 129, 130, 131, 132, 133, 134)
  }
}

#undef KILN_WGMMA_TYPED
#undef KILN_WGMMA_RS8
#undef KILN_WGMMA_RS
#undef KILN_WGMMA_SS8
#undef KILN_WGMMA_SS
#undef KILN_WGMMA_F_128
#undef KILN_WGMMA_F_96
#undef KILN_WGMMA_F_88
#undef KILN_WGMMA_F_64
#undef KILN_WGMMA_F_32
#undef KILN_WGMMA_F_16
#undef KILN_WGMMA_F128
#undef KILN_WGMMA_F96
#undef KILN_WGMMA_F88
#undef KILN_WGMMA_F64
#undef KILN_WGMMA_F32
#undef KILN_WGMMA_F8
#undef KILN_WGMMA_R128
#undef KILN_WGMMA_R96
#undef KILN_WGMMA_R88
#undef KILN_WGMMA_R64
#undef KILN_WGMMA_R32
#undef KILN_WGMMA_R16

}  // namespace kiln::wgmma
