// The decode family's kernels as the host sees them: what decides each compiled variant, the
// specs, and the launch sequences (append and split-KV attention; merge_states). Validation lives
// in decode.cpp; everything here assumes validated inputs.
#pragma once

#include "kiln/decode.hpp"
#include "kiln/params/decode.h"
#include "kiln/spec.hpp"

namespace kiln::detail {

// The most key splits one call takes (DecodeOptions::num_splits and the heuristic).
constexpr int kMaxDecodeSplits = 128;

// m16 row tiles a CTA of attention_decode packs: 1, 2 or 4, fewer for wide heads (more rows
// take more row blocks).
int decode_m_tiles(int rows_per_kv_head, int head_dim_v);

KernelSpec decode_append_spec(const DecodeProblem& problem);
KernelSpec decode_attention_spec(const DecodeProblem& problem, const DecodeConfig& config);
// The merge_states kernel of states whose v has dtype `in`.
KernelSpec merge_spec(DType in, DType out, int head_dim);

// Runs a validated decode call: the append kernel when problem.append (which also writes the
// rotated q into scratch when problem.rotary), then attention_decode, whose splits merge their
// partial states into p.out and p.maybe_lse themselves. Scratch comes from
// runtime.allocate_async on `stream` and goes back the same way. p.num_splits, partial_out,
// partial_lse, split_flags, split_tag and maybe_q_rotated are filled in here.
void launch_decode(Runtime& runtime, const DecodeProblem& problem, const DecodeConfig& config,
                   DecodeParams p, void* stream);

// Runs merge_states_kernel over a validated MergeParams; `in` is the dtype of the states' v.
void launch_merge(Runtime& runtime, DType in, DType out, int head_dim, const MergeParams& p,
                  void* stream);

}  // namespace kiln::detail
