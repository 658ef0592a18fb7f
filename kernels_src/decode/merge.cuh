// Merges attention states (output v and natural-log LSE s over disjoint key sets) into the
// attention over their union: s_out = log(sum exp(s_i)), v_out = sum exp(s_i - s_out) v_i.
// Split-KV's second stage and kiln::merge_states.
//
// Spec constants: dtype_in (kiln::f32, f16 or bf16: the states' v), dtype_out (out), head_dim
// (a multiple of 4 up to 256).
//
// Launch: grid (ceil(seqlen * heads * head_dim / 4 / 128), batch), 128 threads, no shared
// memory. Each thread merges 4 consecutive elements of one (batch, token, head) row; the LSEs
// it reads are the same for the row's threads, so they come from cache.
#pragma once

#include "attention/math.cuh"
#include "common/prelude.cuh"
#include "kiln/params/decode.h"

namespace kiln {

template <class Spec>
__global__ void __launch_bounds__(128) merge_states_kernel(const KILN_GRID_CONSTANT MergeParams p) {
  using In = typename Spec::dtype_in;
  using Out = typename Spec::dtype_out;
  constexpr int head_dim = static_cast<int>(Spec::head_dim);
  static_assert(head_dim % 4 == 0 && head_dim >= 4 && head_dim <= 256,
                "head_dim must be a multiple of 4 up to 256.");
  constexpr int quads = head_dim / 4;

  const long long item = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= static_cast<long long>(p.seqlen) * p.heads * quads) return;
  const int row = static_cast<int>(item / quads);
  const int col = static_cast<int>(item % quads) * 4;
  const int token = row / p.heads;
  const int head = row % p.heads;
  const int batch = blockIdx.y;

  // The state loops are unrolled so that their independent loads overlap: with few rows (one
  // decode token) each thread walks many states, and latency is all there is.
  float top = attention::neg_inf();
  for (int src = 0; src < p.sources; ++src) {
    const MergeSource& m = p.source[src];
    const float* const lse =
        m.lse + batch * m.lse_batch_stride + token * m.lse_seq_stride + head * m.lse_head_stride;
#pragma unroll 8
    for (int s = 0; s < m.states; ++s) top = fmaxf(top, lse[s * m.lse_state_stride]);
  }

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  float total = 0.f;
  if (top != attention::neg_inf()) {
    for (int src = 0; src < p.sources; ++src) {
      const MergeSource& m = p.source[src];
      const float* const lse =
          m.lse + batch * m.lse_batch_stride + token * m.lse_seq_stride + head * m.lse_head_stride;
      const In* const v = static_cast<const In*>(m.v) + batch * m.v_batch_stride +
                          token * m.v_seq_stride + head * m.v_head_stride + col;
#pragma unroll 8
      for (int s = 0; s < m.states; ++s) {
        const float weight = exp2f((lse[s * m.lse_state_stride] - top) * attention::kLog2e);
        const In* const state = v + s * m.v_state_stride;
        total += weight;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          // An empty state (-inf, weight 0) may hold anything, NaN included: select, not scale.
          const float x = to_float(state[e]);
          acc[e] += weight == 0.f ? 0.f : weight * x;
        }
      }
    }
  }
  const float inv = total > 0.f ? 1.f / total : 0.f;
  Out* const out = static_cast<Out*>(p.out) + batch * p.out_batch_stride +
                   token * p.out_seq_stride + head * p.out_head_stride + col;
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = from_float<Out>(acc[e] * inv);
  if (col == 0 && p.maybe_out_lse != nullptr) {
    p.maybe_out_lse[batch * p.out_lse_batch_stride + token * p.out_lse_seq_stride +
                    head * p.out_lse_head_stride] =
        total > 0.f ? top + logf(total) : attention::neg_inf();
  }
}

}  // namespace kiln
