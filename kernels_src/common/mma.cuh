// SPDX-License-Identifier: Apache-2.0
// CUDA PTX wrappers for tensor-core kernels (sm_80+): cp.async, ldmatrix, mma.sync m16n8k16,
// fragment packing, quad reductions and warp votes, and the MUFU approximations (exp2, tanh,
// reciprocal, log2) of the softmax and the merges.
//
// NOTE: this header and common/wgmma.cuh (Hopper only) hold all the inline PTX. AMD targets run
// attention through the portable kernel (attention/prefill/forward_portable.cuh), which includes
// neither; an MFMA path would give the same function names here, chosen through vendor.cuh's
// KILN_HIP, so kernels above this layer stay vendor-free.
#pragma once

#include "common/prelude.cuh"

namespace kiln::mma {

__device__ __forceinline__ unsigned smem_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}

// The same pointer, but the optimizer can no longer see how it was computed: stops it from
// turning a running pointer back into many loop-invariant offsets held in registers.
template <class T>
__device__ __forceinline__ T* opaque(T* pointer) {
  asm volatile("" : "+l"(pointer));
  return pointer;
}
__device__ __forceinline__ unsigned opaque(unsigned value) {
  asm volatile("" : "+r"(value));
  return value;
}

// How long the L2 keeps what a cp.async reads. keep: the default, for data other CTAs read
// again. stream: evicted first, for data read once (decode's KV cache), so that a long stream
// does not push out what is still needed, the kernel's own code among it.
enum class L2 { keep, stream };

// Copies 16 bytes global -> shared without blocking; when !valid it reads nothing and writes
// 16 zero bytes, which is how tiles are padded past the end of a tensor.
template <L2 Policy = L2::keep>
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  if constexpr (Policy == L2::keep) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_bytes));
  } else {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
                 "l"(src), "r"(src_bytes), "l"(policy));
  }
}

// Copies 4 bytes global -> shared without blocking (through L1, as cp.async takes 4 bytes
// only so); when !valid it reads nothing and writes 4 zero bytes.
__device__ __forceinline__ void cp_async_4(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}

// Waits until at most Pending of this thread's committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i
// receives matrix i, row lane / 4, columns 2 * (lane % 4) and +1.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// As ldmatrix_x4, each matrix transposed: register i receives column lane / 4, rows
// 2 * (lane % 4) and +1.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// d += a * b for a 16x16 (row) by 16x8 (col) tile, fp32 accumulators. Fragments, with
// g = lane / 4 and t = lane % 4: a[0..3] = A(g, 2t..), A(g+8, 2t..), A(g, 8+2t..),
// A(g+8, 8+2t..); b[0..1] = B(2t.., g), B(8+2t.., g); d[0..3] = D(g, 2t), D(g, 2t+1),
// D(g+8, 2t), D(g+8, 2t+1).
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
  if constexpr (is_same<T, f16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(is_same<T, bf16>::value, "mma_16816 takes f16 or bf16 operands.");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T and packed, lo in the low half (the element with the lower index).
template <class T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  unsigned r;
  if constexpr (is_same<T, f16>::value) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    static_assert(is_same<T, bf16>::value, "pack2 packs f16 or bf16.");
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// 2^x in one MUFU op; -inf gives 0, and subnormal results flush to 0 (harmless for softmax).
__device__ __forceinline__ float exp2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// 1 / x and log2(x) in one MUFU op each; for x of normal range (subnormals flush to 0).
__device__ __forceinline__ float rcp_approx(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float log2_approx(float x) {
  float r;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ float tanh_approx(float x) {
  float r;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

// exp2_approx and tanh_approx for code that templates on its math (attention's logits).
struct ApproxMath {
  static __device__ __forceinline__ float exp2(float x) { return exp2_approx(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanh_approx(x); }
};

// Reductions over the 4 lanes (a quad) that hold one row of an mma accumulator tile.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ bool warp_any(bool predicate) {
  return __any_sync(0xffffffffu, predicate) != 0;
}

}  // namespace kiln::mma
