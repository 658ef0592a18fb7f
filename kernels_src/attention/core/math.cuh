// SPDX-License-Identifier: Apache-2.0
// Vendor-neutral arithmetic of the attention kernels: log-base constants, -inf, the library
// exp2/tanh, and the online softmax's rules for masked rows. No inline assembly, so every kernel
// may include it.
#pragma once

#include "common/prelude.cuh"

namespace kiln::attention {

constexpr float kLn2 = 0.693147180559945309f;
constexpr float kLog2e = 1.442695040888963407f;

// -inf; a function because NVRTC has no constexpr spelling of it.
__device__ __forceinline__ float neg_inf() {
  return __int_as_float(static_cast<int>(0xff800000u));
}

// exp2 and tanh from the device math library, for code that templates on its math (the
// portable kernel; the tensor-core one uses mma::ApproxMath).
struct LibraryMath {
  static __device__ __forceinline__ float exp2(float x) { return exp2f(x); }
  static __device__ __forceinline__ float tanh(float x) { return tanhf(x); }
};

// The base-2 exponent shift of a row whose largest logit is row_max. NOTE: while every logit of
// a row is masked the max is -inf; shifting by 0 instead keeps the exponents at -inf
// (probabilities 0) rather than NaN.
__device__ __forceinline__ float softmax_shift(float row_max, float to_log2) {
  return row_max == neg_inf() ? 0.f : row_max * to_log2;
}

// The factor that takes a row's sum and outputs from its old running max to the new one, whose
// shift is softmax_shift(new_max, to_log2).
template <class Math>
__device__ __forceinline__ float softmax_rescale(float old_max, float new_max, float shift,
                                                 float to_log2) {
  return new_max == old_max ? 1.f : Math::exp2(old_max * to_log2 - shift);
}

// Whether a finished row's (or merged state's) sum of exponentials counts anything: false for 0,
// a row that attended no key; true for NaN, so that a NaN logit, sink or state reaches the
// output and the LSE as NaN, as in a reference softmax, instead of reading as an empty row.
__device__ __forceinline__ bool attended(float sum) {
  return sum != 0.f;
}

// A finished row's natural-log sum of exp of its logits, from the shift its sum of exp2(logit *
// to_log2 - shift) counts from (base-2 units): -inf for a row that attended no key (sum 0).
__device__ __forceinline__ float row_lse(float shift, float sum) {
  return attended(sum) ? shift * kLn2 + logf(sum) : neg_inf();
}

// Counts an attention sink into a finished row: one more logit, `sink` (natural units; -inf:
// none), that joins the softmax's denominator but has no value. The row's sum counts exp2 from
// `shift` (base-2 units; any value while the sum is 0); when the sink lies above it, shift moves
// to the sink and the sum with it. Returns the factor that takes the row's unnormalized outputs
// along (1 when shift stays). A NaN sink makes the row NaN: its sum, shift and factor.
__device__ __forceinline__ float add_sink(float sink, float& shift, float& sum) {
  const float s = sink * kLog2e;
  if (s == neg_inf()) return 1.f;
  if (s != s) {
    sum = shift = s;
    return s;
  }
  if (sum == 0.f || s > shift) {
    const float factor = sum == 0.f ? 0.f : exp2f(shift - s);
    sum = sum * factor + 1.f;
    shift = s;
    return factor;
  }
  sum += exp2f(s - shift);
  return 1.f;
}

}  // namespace kiln::attention
