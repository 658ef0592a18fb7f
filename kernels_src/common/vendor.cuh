// SPDX-License-Identifier: Apache-2.0
// The device-side vendor layer: every CUDA/HIP difference in kernel code lives here.
#pragma once

#if defined(__HIPCC_RTC__) || defined(__HIP__)
#define KILN_HIP 1
// hipRTC pre-includes the HIP runtime and fp16 headers; bf16 is kiln's own below.
#define KILN_GRID_CONSTANT
#define KILN_WARP_SIZE 64
#else
#define KILN_CUDA 1
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define KILN_GRID_CONSTANT __grid_constant__
#define KILN_WARP_SIZE 32
#endif

namespace kiln {

using f16 = __half;
using f32 = float;
using f64 = double;
// fp8 elements (OCP's E4M3FN and E5M2) as stored: the kernels that read them convert them in
// pairs as mma fragments (attention/core/fp8.cuh), never one by one.
struct e4m3 {
  unsigned char bits;
};
struct e5m2 {
  unsigned char bits;
};

#if KILN_CUDA
using bf16 = __nv_bfloat16;
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ bf16 to_bf16(float x) {
  return __float2bfloat16_rn(x);
}
#else
// hipRTC of ROCm 5.x has no bf16 type of its own: the bits of the upper half of a float.
struct bf16 {
  unsigned short bits;
};
__device__ __forceinline__ float to_float(bf16 x) {
  return __uint_as_float(static_cast<unsigned int>(x.bits) << 16);
}
__device__ __forceinline__ bf16 to_bf16(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<unsigned short>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<unsigned short>(u >> 16)};
}
#endif

__device__ __forceinline__ float to_float(f16 x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ double to_float(double x) {
  return x;
}

// Converts from the compute type (float, or double for f64 data) to the storage type T.
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ f16 from_float<f16>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return to_bf16(x);
}
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
__device__ __forceinline__ double from_double(double x) {
  return x;
}

// x of lane (this lane ^ lane_mask) of the warp; every lane of the warp must call it.
__device__ __forceinline__ float shfl_xor(float x, int lane_mask) {
#if KILN_CUDA
  return __shfl_xor_sync(0xffffffffu, x, lane_mask);
#else
  return __shfl_xor(x, lane_mask);  // HIP of ROCm 5.x has no _sync shuffles
#endif
}

// Programmatic dependent launch (LaunchConfig::overlap_previous). wait_for_previous_grid: blocks
// until the grids before this one on the stream have finished and their writes are visible;
// a kernel launched to overlap calls it before touching global memory. allow_next_grid: once
// every CTA of this grid has called it (or exited), the kernel after this one may be scheduled;
// it makes none of this grid's writes visible. No-ops before sm_90 and on AMD; without the
// overlap requested, the stream orders the kernels anyway.
__device__ __forceinline__ void wait_for_previous_grid() {
#if KILN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_grid() {
#if KILN_CUDA && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace kiln
