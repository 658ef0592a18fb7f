// SPDX-License-Identifier: Apache-2.0
// The attention family's forward kernels as the host describes them, one description each: its
// name, spec schema and targets, and its CTA (threads and dynamic shared memory) from the typed
// problem and config. choose(), attention_spec(), warm-up, the fit check and the launch
// (ops/attention.cpp) read them.
#pragma once

#include "kernels/kernel.hpp"
#include "kiln/attention.hpp"

namespace kiln::detail {

// The targets a kernel runs on.
enum class AttentionTargets {
  any,    // NVIDIA sm_80 and newer, and AMD's wave64 gfx9 targets
  sm80,   // NVIDIA sm_80 and newer
  sm90a,  // Hopper's arch-specific target (H100, H200), the one with wgmma
};

struct AttentionDescription {
  AttentionKernel kernel;
  std::string_view name;  // "mma", as messages name the kernel
  KernelSchema schema;
  AttentionTargets targets;
  int (*threads)(const AttentionConfig& config);  // per CTA
  long long (*shared_bytes)(const AttentionProblem& problem, const AttentionConfig& config);
};

// The description of `kernel`; kiln::Error (invalid_argument) for a value that is no
// AttentionKernel.
const AttentionDescription& describe(AttentionKernel kernel);

// Every forward kernel's description, for the registry.
std::span<const AttentionDescription> attention_descriptions();

// The operand dtypes (q, k and v, out) every forward kernel and the backward take, a row per
// combination.
std::span<const OperandDTypes> attention_operand_dtypes();

// Those some forward kernel takes: the tma kernel's, with fp8 k and v under a 16-bit q (the mma
// kernel takes those too) and e4m3 q, k and v with a 16-bit out.
std::span<const OperandDTypes> attention_forward_operand_dtypes();

// The constants of the portable forward kernel, which the portable backward kernels take too.
std::span<const ConstantSchema> attention_portable_constants();

// The spec of `schema`'s kernel, one whose constants are among the forward's: the problem's, and
// the sizes of `config` it takes (attention_spec() for the forward kernels, and the backward's).
KernelSpec attention_family_spec(const KernelSchema& schema, const AttentionProblem& problem,
                                 const AttentionConfig& config);

// Whether attention runs on `target` at all: NVIDIA sm_80 and newer, AMD gfx9.
bool attention_runs_on(const Target& target);

// Whether `target` is Hopper's arch-specific sm_90a, the one with wgmma and TMA.
bool is_sm90a(const Target& target);

// The bytes of an element of the tma kernel's Q K^T operands in shared memory (the Params
// formulas' qk_size): q's, but 1 for a bf16 q over e4m3 k and v, which the kernel splits into two
// e4m3 terms for fp8 products against K as it lands.
long long attention_tma_qk_bytes(DType q, DType kv);

// Throws kiln::Error (unsupported) when `target` cannot run `kernel`, saying what can.
void require_target(const Target& target, AttentionKernel kernel);

// Throws kiln::Error (unsupported) for fp8 k and v that `kernel` on `target` cannot read: the
// mma kernel (and tma, on sm_90a) reads them, on sm_89 and newer, with head dims multiples of 16;
// an fp8 q only the tma kernel, on sm_90a.
void require_kv_dtype(const AttentionProblem& problem, AttentionKernel kernel,
                      const Target& target);

// Throws kiln::Error (unsupported) for a caller's tma config whose tiles the all-fp8 forward
// (fp8 `problem.dtype_q`) cannot take: it computes 128 query rows (two consumer warpgroups) on
// 128 or 256 keys a block (whole 128-key chunks of transposed V), 256 only up to head_dim_v 128.
void require_fp8_q_tiles(const AttentionProblem& problem, const AttentionConfig& config);

// Throws kiln::Error (invalid_argument) for a caller's config with no such kernel or a size out of
// range, and (unsupported) for a kernel `target` cannot run.
void check_config(const AttentionConfig& config, const Target& target);

// The config that loads `config`'s tiles without TMA, for inputs of `problem` TMA cannot tile:
// the wgmma kernel, which steps by multiples of 64 keys; with fp8 k and v, which wgmma does not
// read, the mma kernel's config for them.
AttentionConfig without_tma(const AttentionProblem& problem, const AttentionConfig& config);

// The launch of `config` for `problem`: attention_spec's kernel, with the threads and dynamic
// shared memory its description computes. The grid depends on the sizes of the call (row
// blocks, heads, batch), so the launch makes it.
LaunchPlan attention_plan(const AttentionProblem& problem, const AttentionConfig& config);

// Throws kiln::Error (unsupported) when `device` cannot run `plan`, the launch of `config`.
void require_fits(const LaunchPlan& plan, const AttentionConfig& config, const DeviceInfo& device);

}  // namespace kiln::detail
