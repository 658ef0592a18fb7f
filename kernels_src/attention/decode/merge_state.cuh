// SPDX-License-Identifier: Apache-2.0
// The running merge of attention states (output v and natural-log LSE over disjoint key sets)
// that merge_states_kernel and attention_decode's in-kernel split merge share.
#pragma once

#include "attention/core/math.cuh"

namespace kiln {
namespace decode {

// A partial merge: the running max of the LSEs seen, the sum of exp(lse - max), and the
// weighted sum of their v.
template <int Quads>
struct MergeAccumulator {
  float top;
  float total;
  float acc[Quads][4];

  __device__ __forceinline__ void init() {
    top = attention::neg_inf();
    total = 0.f;
#pragma unroll
    for (int q = 0; q < Quads; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][e] = 0.f;
    }
  }

  // Adds N states, of LSEs lse[j] and v elements v[j]. Their weights do not depend on each
  // other, so they compute side by side. weight * v is skipped for an empty state (-inf),
  // which may hold anything, NaN included; a NaN LSE makes the merge NaN (attended()).
  template <int N>
  __device__ __forceinline__ void add(const float (&lse)[N], const float (&v)[N][Quads][4]) {
    float batch_top = attention::neg_inf();  // of the LSEs that are not NaN
    bool any = false;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      batch_top = fmaxf(batch_top, lse[j]);
      any |= lse[j] != attention::neg_inf();
    }
    if (!any) return;
    if (batch_top > top) {
      const float rescale =
          top == attention::neg_inf() ? 0.f : exp2f((top - batch_top) * attention::kLog2e);
      total *= rescale;
#pragma unroll
      for (int q = 0; q < Quads; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][e] *= rescale;
      }
      top = batch_top;
    }
#pragma unroll
    for (int j = 0; j < N; ++j) {
      if (lse[j] == attention::neg_inf()) continue;
      const float weight = exp2f((lse[j] - top) * attention::kLog2e);
      total += weight;
#pragma unroll
      for (int q = 0; q < Quads; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][e] += weight * v[j][q][e];
      }
    }
  }

  __device__ __forceinline__ void add(float lse, const float (&v)[Quads][4]) {
    const float one[1] = {lse};
    add(one, reinterpret_cast<const float(&)[1][Quads][4]>(v));
  }
};

}  // namespace decode

}  // namespace kiln
