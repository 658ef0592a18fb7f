// SPDX-License-Identifier: Apache-2.0
// Merges attention states (output v and natural-log LSE s over disjoint key sets) into the
// attention over their union: s_out = log(sum exp(s_i)), v_out = sum exp(s_i - s_out) v_i.
// Split-KV's second stage and kiln::merge_states.
//
// Spec constants: dtype_in (kiln::f32, f16 or bf16: the states' v), dtype_out (out), head_dim
// (a multiple of 4 up to 256).
//
// Launch: grid (seqlen * heads, batch), kMergeThreads (128) threads, no dynamic shared memory, with
// LaunchConfig::overlap_previous (it waits for the previous grid first). One CTA merges
// one (batch, token, head) row: its 4 warps take every 4th state, each lane 4 consecutive
// elements (two quads at head dims above 128), with a running max so that one pass over the
// states suffices and their loads overlap; the warps' partial merges then meet in shared
// memory. Split-KV merges few rows of many states, so latency is what this is built against.
#pragma once

#include "attention/decode/merge_state.cuh"
#include "common/prelude.cuh"
#include "kiln/params/decode.h"

namespace kiln {

template <class Spec>
__global__ void __launch_bounds__(kMergeThreads)
    merge_states_kernel(const KILN_GRID_CONSTANT MergeParams p) {
  using In = typename Spec::dtype_in;
  using Out = typename Spec::dtype_out;
  constexpr int head_dim = static_cast<int>(Spec::head_dim);
  static_assert(head_dim % 4 == 0 && head_dim >= 4 && head_dim <= 256,
                "head_dim must be a multiple of 4 up to 256.");
  constexpr int warps = kMergeThreads / 32;
  constexpr int quads = head_dim / 4 > 32 ? 2 : 1;  // per lane
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Launched to overlap the kernel before it (split-KV's first stage, or whatever the caller of
  // merge_states ran), whose states are complete only past this point. The kernel after this
  // one may be scheduled from here on.
  wait_for_previous_grid();
  allow_next_grid();

  const int row = blockIdx.x;
  const int token = row / p.heads;
  const int head = row % p.heads;
  const int batch = blockIdx.y;

  // This lane's columns: 4 * (lane + 32 q), those below head_dim.
  bool has[quads];
#pragma unroll
  for (int q = 0; q < quads; ++q) has[q] = 4 * (lane + 32 * q) < head_dim;

  decode::MergeAccumulator<quads> merged;
  merged.init();
  for (int src = 0; src < p.sources; ++src) {
    const MergeSource& m = p.source[src];
    const float* const lse =
        m.lse + batch * m.lse_batch_stride + token * m.lse_seq_stride + head * m.lse_head_stride;
    const In* const v = static_cast<const In*>(m.v) + batch * m.v_batch_stride +
                        token * m.v_seq_stride + head * m.v_head_stride + 4 * lane;
#pragma unroll 4
    for (int s = warp; s < m.states; s += warps) {
      const In* const state = v + s * m.v_state_stride;
      float x[quads][4];
#pragma unroll
      for (int q = 0; q < quads; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) x[q][e] = has[q] ? to_float(state[32 * 4 * q + e]) : 0.f;
      }
      merged.add(lse[s * m.lse_state_stride], x);
    }
  }

  // Warps 1..3 hand their partial merges to warp 0.
  __shared__ float shared_top[warps];
  __shared__ float shared_total[warps];
  __shared__ float shared_acc[warps][quads][32][4];
  if (lane == 0) {
    shared_top[warp] = merged.top;
    shared_total[warp] = merged.total;
  }
#pragma unroll
  for (int q = 0; q < quads; ++q) {
#pragma unroll
    for (int e = 0; e < 4; ++e) shared_acc[warp][q][lane][e] = merged.acc[q][e];
  }
  __syncthreads();
  if (warp != 0) return;
  decode::MergeAccumulator<quads> all;
  all.init();
  for (int w = 0; w < warps; ++w) {
    // A partial merge is a state of LSE top + log(total) whose v is acc / total.
    const float total = shared_total[w];
    float x[quads][4];
#pragma unroll
    for (int q = 0; q < quads; ++q) {
#pragma unroll
      for (int e = 0; e < 4; ++e)
        x[q][e] = attention::attended(total) ? shared_acc[w][q][lane][e] / total : 0.f;
    }
    all.add(attention::attended(total) ? shared_top[w] + logf(total) : attention::neg_inf(), x);
  }

  const float inv = attention::attended(all.total) ? 1.f / all.total : 0.f;
  Out* const out = static_cast<Out*>(p.out) + batch * p.out_batch_stride +
                   token * p.out_seq_stride + head * p.out_head_stride + 4 * lane;
#pragma unroll
  for (int q = 0; q < quads; ++q) {
    if (!has[q]) continue;
#pragma unroll
    for (int e = 0; e < 4; ++e) out[32 * 4 * q + e] = from_float<Out>(all.acc[q][e] * inv);
  }
  if (lane == 0 && p.maybe_out_lse != nullptr) {
    p.maybe_out_lse[batch * p.out_lse_batch_stride + token * p.out_lse_seq_stride +
                    head * p.out_lse_head_stride] =
        attention::attended(all.total) ? all.top + logf(all.total) : attention::neg_inf();
  }
}

}  // namespace kiln
