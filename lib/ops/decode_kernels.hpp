// SPDX-License-Identifier: Apache-2.0
// The decode family's kernels as the host sees them: what decides each compiled variant, the
// specs, and the launch sequences (append and split-KV attention; merge_states). Validation lives
// in decode.cpp; everything here assumes validated inputs.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/decode.hpp"
#include "kiln/params/decode.h"
#include "kiln/spec.hpp"
#include "ops/launch_plan.hpp"

namespace kiln::detail {

// The most key splits one call takes (DecodeOptions::num_splits and the heuristic).
constexpr int kMaxDecodeSplits = 128;

// m16 row tiles a CTA of attention_decode packs: 1, 2 or 4, fewer for wide heads (more rows
// take more row blocks). choose() decides DecodeConfig::m_tiles with it.
int decode_m_tiles(int rows_per_kv_head, int head_dim_v);

// The CTAs of attention_decode along a kv head's query rows, of 16 * config.m_tiles each.
std::int64_t decode_row_blocks(const DecodeProblem& problem, const DecodeConfig& config);

KernelSpec decode_append_spec(const DecodeProblem& problem);
KernelSpec decode_attention_spec(const DecodeProblem& problem, const DecodeConfig& config);
// The merge_states kernel of states whose v has dtype `in`.
KernelSpec merge_spec(DType in, DType out, int head_dim);

// Each kernel's launch: its spec, with the threads and dynamic shared memory it declares. The
// grids depend on the sizes of the call, so the launches make them.
LaunchPlan decode_append_plan(const DecodeProblem& problem);
LaunchPlan decode_attention_plan(const DecodeProblem& problem, const DecodeConfig& config);
LaunchPlan merge_plan(DType in, DType out, int head_dim);

// Every kernel one decode call launches, planned before any is fetched or run.
struct DecodePlan {
  std::optional<LaunchPlan> append;  // problem.append
  LaunchPlan attention;
};
DecodePlan decode_plan(const DecodeProblem& problem, const DecodeConfig& config);

// Throws kiln::Error (unsupported) when `device` cannot run a kernel of `plan`, made with
// `config`: that choose() gave `planned` (the target it planned for, which may not be the
// device's: Options::target), or, where `planned` is null, the caller's. The append and merge
// kernels take kDecodeAppendThreads and kMergeThreads, 128, and no shared memory: every device
// runs them; choose() plans the attention kernel within its target's limits.
void require_fits(const DecodePlan& plan, const DecodeConfig& config, const Target* planned,
                  const DeviceInfo& device);

// Runs a validated decode call whose `plan` fits the device: fetches its kernels, then the
// append kernel when problem.append (which also writes the rotated q into scratch when
// problem.rotary), then attention_decode, whose splits merge their partial states into p.out and
// p.maybe_lse themselves. Scratch comes from runtime.allocate_async on `stream` and goes back the
// same way. p.num_splits, partial_out, partial_lse, split_flags, split_tag and maybe_q_rotated
// are filled in here.
void launch_decode(Runtime& runtime, const DecodeProblem& problem, const DecodeConfig& config,
                   const DecodePlan& plan, DecodeParams p, void* stream);

// Runs merge_states_kernel over a validated MergeParams for `call`; `in` is the dtype of the
// states' v.
void launch_merge(Runtime& runtime, CallName call, DType in, DType out, int head_dim,
                  const MergeParams& p, void* stream);

}  // namespace kiln::detail
