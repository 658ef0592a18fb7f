// SPDX-License-Identifier: Apache-2.0
// The decode family's kernels as the host describes them, one description each (the append,
// the decode attention kernels of DecodeKernel, merge_states): name, spec schema, targets, and
// the CTA (threads and dynamic shared memory) from the typed problem and config; with choose()'s
// tuning and the launch plans made from them. Validation lives in ops/decode.cpp, the launch
// sequences in ops/decode_kernels.cpp.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/kernel.hpp"
#include "kiln/decode.hpp"

namespace kiln::detail {

// The most key splits one call takes (DecodeOptions::num_splits, DecodeConfig::num_splits and
// the heuristic).
constexpr int kMaxDecodeSplits = 128;

extern const FixedKernel kDecodeAppendKernel;
extern const FixedKernel kMergeStatesKernel;

// A decode attention kernel (DecodeConfig::kernel).
struct DecodeDescription {
  DecodeKernel kernel;
  std::string_view name;  // "mma", as messages name the kernel
  KernelSchema schema;
  int (*threads)(const DecodeConfig& config);  // per CTA
  long long (*shared_bytes)(const DecodeProblem& problem, const DecodeConfig& config);
};

// The description of `kernel`; kiln::Error (invalid_argument) for a value that is no
// DecodeKernel.
const DecodeDescription& describe(DecodeKernel kernel);

// Every decode attention kernel's description, for the registry.
std::span<const DecodeDescription> decode_descriptions();

// The operand dtypes (q, the cache, out) the decode kernels take, a row per combination.
std::span<const OperandDTypes> decode_operand_dtypes();

// Throws kiln::Error (unsupported) when decode does not run on `target`.
void require_target(const Target& target);
// An fp8 cache's conditions (kiln::Error, unsupported): head dims multiples of 16
// (check_cache_dtype), and an sm_89 or newer target (require_cache_dtype, which checks both).
void check_cache_dtype(const DecodeProblem& problem);
void require_cache_dtype(const DecodeProblem& problem, const Target& target);

// Throws kiln::Error (invalid_argument) for a caller's config with no such kernel or a size its
// kernel does not take (attention/decode/attention.cuh asserts the same when it compiles).
void check_config(const DecodeConfig& config);

// m16 row tiles a CTA of attention_decode packs: 1, 2 or 4, fewer for wide heads (more rows
// take more row blocks). choose() decides DecodeConfig::m_tiles with it.
int decode_m_tiles(int rows_per_kv_head, int head_dim_v);

// The CTAs of attention_decode along a kv head's query rows, of 16 * config.m_tiles each.
std::int64_t decode_row_blocks(const DecodeProblem& problem, const DecodeConfig& config);

KernelSpec decode_append_spec(const DecodeProblem& problem);
KernelSpec decode_attention_spec(const DecodeProblem& problem, const DecodeConfig& config);
// The merge_states kernel of states whose v has dtype `in`.
KernelSpec merge_spec(DType in, DType out, int head_dim);

// Each kernel's launch: its spec, with the threads and dynamic shared memory its description
// gives. The grids depend on the sizes of the call, so the launches make them.
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
// kernels take 128 threads and no shared memory: every device runs them; choose() plans the
// attention kernel within its target's limits.
void require_fits(const DecodePlan& plan, const DecodeConfig& config, const Target* planned,
                  const DeviceInfo& device);

}  // namespace kiln::detail
