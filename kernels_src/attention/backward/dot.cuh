// SPDX-License-Identifier: Apache-2.0
// The backward's pre-pass and the sinks' gradient, for every backward kernel:
//   attention_backward_dot: D = rowsum(dO * O) of each query row (fp32, into p.row_dot at the
//     LSE's offsets), and with sinks each CTA's share of their gradient, -sum exp(sink - lse) D
//     over its rows (the sink only joins each row's denominator, so it takes P_sink * D away).
//   attention_backward_sinks: adds those shares up per head, in one fixed order.
// Neither uses atomics: the gradients are bitwise the same run to run.
//
// Spec constants of attention_backward_dot: dtype_out, head_dim_v, varlen (as the forward's), and
// with dsinks the call's user variant, whose sink hook it refuses. attention_backward_sinks takes
// none.
//
// Launch: attention_backward_dot on grid (ceil(seqlen_q / kAttentionBackwardDotRows), heads,
// batch), kAttentionBackwardDotThreads threads; attention_backward_sinks on grid (heads),
// kAttentionBackwardSinksThreads threads, after it. No dynamic shared memory.
#pragma once

#include "attention/backward/rows.cuh"
#include "attention/core/lane_chunks.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/math.cuh"
#include "attention/prefill/sequence.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention_backward.h"

namespace kiln {
namespace attention {

// The sum of x over a CTA of Threads threads, in thread 0, in an order fixed by Threads alone.
template <int Threads>
__device__ __forceinline__ float cta_sum(float x, float* scratch) {
  static_assert(Threads % 32 == 0 && Threads <= 1024, "whole warps, at most 1024 threads");
  x = group_sum<32>(x);  // within a warp's 32 lanes (half an AMD wavefront)
  const int thread = static_cast<int>(threadIdx.x);
  if (thread % 32 == 0) scratch[thread / 32] = x;
  __syncthreads();
  float sum = 0.f;
  if (thread == 0) {
    for (int w = 0; w < Threads / 32; ++w) sum += scratch[w];
  }
  return sum;
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(kAttentionBackwardDotThreads)
    attention_backward_dot(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Out = typename Spec::dtype_out;
  constexpr int kLanes = kAttentionBackwardDotThreads / kAttentionBackwardDotRows;
  constexpr int kChunks = static_cast<int>(Spec::head_dim_v) / 8;
  const AttentionParams& p = bp.fwd;

  const int batch = static_cast<int>(blockIdx.z);
  const int head = static_cast<int>(blockIdx.y);
  const Sequence seq = locate_sequence<Spec::varlen>(p, batch, head);
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % kLanes;
  const int row = static_cast<int>(blockIdx.x) * kAttentionBackwardDotRows + thread / kLanes;
  const bool valid = row < seq.seqlen_q;

  float dot = 0.f;
  if (valid) {
    const Out* const dout_row = static_cast<const Out*>(bp.dout) +
                                dout_offset<Spec::varlen>(bp, batch, head) +
                                row * bp.dout_seq_stride;
    const Out* const out_row =
        static_cast<const Out*>(p.out) + seq.out_offset + row * p.out_seq_stride;
    for_lane_chunks<kChunks, kLanes>(lane, [&](int, int col) {
      float o[8], d[8];
      load_chunk(o, out_row + col);
      load_chunk(d, dout_row + col);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(o[e], d[e], dot);
    });
  }
  dot = group_sum<kLanes>(dot);
  if (valid && lane == 0) bp.row_dot[seq.lse_offset + row] = dot;

  if (bp.maybe_sink_partials == nullptr) return;
  if constexpr (Spec::has_variant) {
    static_assert(!VariantHooks<typename Spec::variant>::sink,
                  "grads.dsinks through kiln_variant::sink is not supported yet (the hook would "
                  "need a derivative): leave dsinks unset; dq, dk and dv take the sink hook into "
                  "account all the same");
  }
  // The CTA's share of dsinks[head]: rows whose LSE is -inf attended nothing, the sink included.
  const float sink = p.score.maybe_sinks[head];
  float share = 0.f;
  if (valid && lane == 0) {
    const float lse = p.maybe_lse[seq.lse_offset + row];
    if (lse != neg_inf()) share = -expf(sink - lse) * dot;
  }
  __shared__ float scratch[kAttentionBackwardDotThreads / 32];
  share = cta_sum<kAttentionBackwardDotThreads>(share, scratch);
  if (thread == 0) {
    bp.maybe_sink_partials[(static_cast<long long>(head) * p.batch + batch) * bp.dot_row_blocks +
                           blockIdx.x] = share;
  }
}

template <class Spec>
__global__ void __launch_bounds__(kAttentionBackwardSinksThreads)
    attention_backward_sinks(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  const int head = static_cast<int>(blockIdx.x);
  const long long count = static_cast<long long>(bp.fwd.batch) * bp.dot_row_blocks;
  const float* const partials = bp.maybe_sink_partials + head * count;
  float sum = 0.f;
  for (long long i = threadIdx.x; i < count; i += kAttentionBackwardSinksThreads) {
    sum += partials[i];
  }
  __shared__ float scratch[kAttentionBackwardSinksThreads / 32];
  sum = cta_sum<kAttentionBackwardSinksThreads>(sum, scratch);
  if (threadIdx.x == 0) bp.maybe_dsinks[head] = sum;
}

}  // namespace kiln
