// SPDX-License-Identifier: Apache-2.0
// The bias's gradient from the dk/dv kernel's fp32 dL / d logit (bp.maybe_dbias_accum, dense
// (batch, heads, seqlen_q, seqlen_k)): attention_backward_dbias writes each element of dbias in
// the bias's dtype, the sum over the batch or the heads where dbias has size 1 there (a bias
// broadcast by size), added in one fixed order without atomics.
//
// Spec constants: dtype_q (the bias's dtype, q's).
//
// Launch, after the dk/dv kernel: grid (ceil(seqlen_q * seqlen_k /
// kAttentionBackwardDbiasThreads), dbias_heads, dbias_batch), kAttentionBackwardDbiasThreads
// threads, no dynamic shared memory.
#pragma once

#include "attention/backward/rows.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention_backward.h"

namespace kiln {

template <class Spec>
__global__ void __launch_bounds__(kAttentionBackwardDbiasThreads)
    attention_backward_dbias(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Bias = typename Spec::dtype_q;
  const AttentionParams& p = bp.fwd;
  const long long plane = static_cast<long long>(p.seqlen_q) * p.seqlen_k;
  const long long at =
      static_cast<long long>(blockIdx.x) * kAttentionBackwardDbiasThreads + threadIdx.x;
  if (at >= plane) return;
  const int head = static_cast<int>(blockIdx.y);
  const int batch = static_cast<int>(blockIdx.z);
  // The (batch, head) pairs this element sums: all of a dim where dbias has size 1.
  const bool all_batch = bp.dbias_batch == 1;
  const bool all_heads = bp.dbias_heads == 1;
  const int batch_end = all_batch ? p.batch : batch + 1;
  const int head_end = all_heads ? p.heads : head + 1;
  float sum = 0.f;
  for (int b = all_batch ? 0 : batch; b < batch_end; ++b) {
    for (int h = all_heads ? 0 : head; h < head_end; ++h) sum += dbias_accum_rows(bp, b, h)[at];
  }
  const int row = static_cast<int>(at / p.seqlen_k);
  const int key = static_cast<int>(at % p.seqlen_k);
  static_cast<Bias*>(bp.maybe_dbias)[batch * bp.dbias_batch_stride + head * bp.dbias_head_stride +
                                     row * bp.dbias_row_stride + key * bp.dbias_col_stride] =
      from_float<Bias>(sum);
}

}  // namespace kiln
