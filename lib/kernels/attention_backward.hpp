// SPDX-License-Identifier: Apache-2.0
// The attention backward's kernels as the host describes them: the row-dot pre-pass and the
// sinks' reduction (fixed CTAs), and the dk/dv and dq kernels of each AttentionBackwardKernel;
// with choose()'s configs and the launch plans made from them. Validation and the launches are
// in ops/attention_backward.cpp.
#pragma once

#include <optional>
#include <span>

#include "kernels/attention.hpp"
#include "kernels/kernel.hpp"
#include "kiln/attention_backward.hpp"

namespace kiln::detail {

extern const FixedKernel kBackwardDotKernel;
extern const FixedKernel kBackwardSinksKernel;
extern const FixedKernel kBackwardDbiasKernel;

// The two kernels of an AttentionBackwardKernel.
struct AttentionBackwardDescription {
  AttentionBackwardKernel kernel;
  std::string_view name;  // "portable", as messages name the kernel
  AttentionTargets targets;
  KernelSchema dkdv;
  KernelSchema dq;
  int (*threads)(const AttentionBackwardConfig& config);  // per CTA, both kernels
  int (*dq_rows)(const AttentionBackwardConfig& config);  // query rows per dq CTA
  long long (*dkdv_shared_bytes)(const AttentionBackwardProblem& problem,
                                 const AttentionBackwardConfig& config);
  long long (*dq_shared_bytes)(const AttentionBackwardProblem& problem,
                               const AttentionBackwardConfig& config);
};

// The description of `kernel`; kiln::Error (invalid_argument) for a value that is none.
const AttentionBackwardDescription& describe(AttentionBackwardKernel kernel);

// Every backward kernel's schema, for the registry: the row dots, the sinks' sum, the bias's
// gradient, then each description's dk/dv and dq kernels.
std::vector<const KernelSchema*> attention_backward_schemas();

// Throws kiln::Error (unsupported) when `target` cannot run `kernel`, saying what can.
void require_target(const Target& target, AttentionBackwardKernel kernel);

// Throws kiln::Error (invalid_argument) for a caller's config with no such kernel or a size out
// of range, and (unsupported) for a target the backward does not run on.
void check_config(const AttentionBackwardConfig& config, const Target& target);

// Every launch of one backward call, planned before any is fetched or run: the row dots, the
// sinks' sum when problem.dsinks, the dk/dv kernel, the dq kernel, and the bias's gradient when
// problem.dbias.
// The dk/dv kernel's CTAs take config.block_n keys each, the dq kernel's dq_rows query rows.
struct AttentionBackwardPlan {
  LaunchPlan dot;
  std::optional<LaunchPlan> sinks;
  LaunchPlan dkdv;
  LaunchPlan dq;
  int dq_rows = 0;
  std::optional<LaunchPlan> dbias;
};
AttentionBackwardPlan attention_backward_plan(const AttentionBackwardProblem& problem,
                                              const AttentionBackwardConfig& config);

// The mma kernel's config from choose()'s tables for `problem` on an NVIDIA `target`: what
// choose() gives where the wgmma kernel does not run (targets other than sm_90a, or q and dout
// that TMA cannot tile).
AttentionBackwardConfig mma_config(const AttentionBackwardProblem& problem, const Target& target);

// Throws kiln::Error (unsupported) when `device` cannot run a launch of `plan`.
void require_fits(const AttentionBackwardPlan& plan, const AttentionBackwardConfig& config,
                  const DeviceInfo& device);

}  // namespace kiln::detail
