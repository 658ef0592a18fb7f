// PTX wrappers for Hopper's warpgroup MMA (sm_90a): wgmma.mma_async m64n64k16 with fp32
// accumulators, its fences and groups, and the shared-memory matrix descriptors of the
// 128-byte-swizzled tiles it reads.
//
// Tile layout (every operand in shared memory): a tile of R rows is cut into column chunks of 64
// elements (128 bytes); chunk c is R rows of 128 bytes at tile + c * R * 128, and the 16-byte
// piece p of row r sits at piece p ^ (r % 8) of that row. Tiles start 1024-byte aligned, so the
// hardware's swizzle (address bits 4-6 xor bits 7-9) is exactly this one.
#pragma once

#include "common/prelude.cuh"

namespace kiln::wgmma {

// Where 16-byte piece `piece` (of 8 elements) of row `row` lies in a swizzled tile of `rows` rows.
__device__ __forceinline__ unsigned swizzled_offset(int rows, int row, int piece) {
  return static_cast<unsigned>((piece / 8) * rows * 128 + row * 128 + ((piece ^ row) % 8) * 16);
}

// The descriptor of a 128-byte-swizzled operand at shared address `address`. K-major operands
// (Q and K, reduction dim contiguous) step 8 rows by `stride_bytes` (1024) and ignore
// `leading_bytes`; N-major ones (V, output dim contiguous) step 8 reduction rows by
// `stride_bytes` and 64 output columns by `leading_bytes`.
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading_bytes,
                                                         unsigned stride_bytes) {
  return static_cast<unsigned long long>((address & 0x3FFFFu) >> 4) |
         static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
         static_cast<unsigned long long>(stride_bytes >> 4) << 32 | 1ull << 62;
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

#define KILN_WGMMA_D32                                                                          \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define KILN_WGMMA_D32_OPERANDS(d)                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define KILN_WGMMA_SS(type)                                                          \
  asm volatile(                                                                      \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                   \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type " " KILN_WGMMA_D32 \
      ", %32, %33, p, 1, 1, 0, %35;\n}\n"                                            \
      : KILN_WGMMA_D32_OPERANDS(d)                                                   \
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)), "n"(TransposeB ? 1 : 0))
#define KILN_WGMMA_RS(type)                                                                    \
  asm volatile(                                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                             \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type " " KILN_WGMMA_D32           \
      ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                        \
      : KILN_WGMMA_D32_OPERANDS(d)                                                             \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)), \
        "n"(TransposeB ? 1 : 0))

// d (+)= A * B for a 64x16 A and a 16x64 B, both from shared memory (descriptors a and b);
// accumulate false overwrites d. Thread t of the warpgroup holds, with w = t / 32,
// g = t % 32 / 4, q = t % 4: d[4j + e] = D(16w + g, 8j + 2q + e), d[4j + 2 + e] =
// D(16w + g + 8, 8j + 2q + e), the mma.sync m16n8 accumulator layout per warp.
template <class T, bool TransposeB>
__device__ __forceinline__ void mma_ss(float (&d)[32], unsigned long long a, unsigned long long b,
                                       bool accumulate) {
  if constexpr (is_same<T, f16>::value) {
    KILN_WGMMA_SS("f16");
  } else {
    static_assert(is_same<T, bf16>::value, "wgmma takes f16 or bf16 operands.");
    KILN_WGMMA_SS("bf16");
  }
}

// As mma_ss with A from registers, in mma.sync's m16n8k16 A-fragment layout per warp (rows
// 16w..16w + 15 of the 64).
template <class T, bool TransposeB>
__device__ __forceinline__ void mma_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long b,
                                       bool accumulate) {
  if constexpr (is_same<T, f16>::value) {
    KILN_WGMMA_RS("f16");
  } else {
    static_assert(is_same<T, bf16>::value, "wgmma takes f16 or bf16 operands.");
    KILN_WGMMA_RS("bf16");
  }
}

#undef KILN_WGMMA_RS
#undef KILN_WGMMA_SS
#undef KILN_WGMMA_D32_OPERANDS
#undef KILN_WGMMA_D32

}  // namespace kiln::wgmma
