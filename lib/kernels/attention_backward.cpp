// SPDX-License-Identifier: Apache-2.0
// The backward kernels' descriptions, choose()'s configs, and the specs and launch plans made
// from them.
#include "kernels/attention_backward.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/attention.hpp"
#include "kiln/error.hpp"
#include "kiln/params/attention_backward.h"

namespace kiln {
namespace detail {
namespace {

constexpr ConstantSchema kDotConstants[] = {{"dtype_out", ConstantKind::dtype},
                                            {"head_dim_v", ConstantKind::integer},
                                            {"varlen", ConstantKind::boolean}};

// The forward's portable config of the same sizes, whose spec constants the portable backward
// kernels share.
AttentionConfig forward_config(const AttentionBackwardConfig& c) {
  return {.block_m = c.block_m,
          .block_n = c.block_n,
          .warps = c.warps,
          .kernel = AttentionKernel::portable};
}

// A spec that arrives as text, parsed into the typed problem and config its kernel's shared
// memory is computed from.
struct ParsedSpec {
  AttentionProblem problem;
  AttentionBackwardConfig config;
};
ParsedSpec parse(const KernelSpec& spec) {
  return {.problem = {.dtype_q = dtype_constant(spec, "dtype_q"),
                      .dtype_kv = dtype_constant(spec, "dtype_kv"),
                      .dtype_out = dtype_constant(spec, "dtype_out"),
                      .head_dim = static_cast<int>(integer_constant(spec, "head_dim")),
                      .head_dim_v = static_cast<int>(integer_constant(spec, "head_dim_v"))},
          .config = {.block_m = static_cast<int>(integer_constant(spec, "block_m")),
                     .block_n = static_cast<int>(integer_constant(spec, "block_n")),
                     .warps = static_cast<int>(integer_constant(spec, "warps"))}};
}

long long portable_dkdv_bytes(const AttentionProblem& p, const AttentionBackwardConfig& c) {
  return attention_backward_dkdv_portable_smem_bytes(
      p.head_dim, p.head_dim_v, c.block_m, element_bytes(p.dtype_q), element_bytes(p.dtype_out));
}

long long portable_dq_bytes(const AttentionProblem& p, const AttentionBackwardConfig& c) {
  return attention_forward_portable_smem_bytes(p.head_dim, p.head_dim_v, c.block_n,
                                               element_bytes(p.dtype_kv));
}

constexpr const char* kParams = "kiln::AttentionBackwardParams";
constexpr const char* kPortableSource = "attention/backward/backward_portable.cuh";

const AttentionBackwardDescription kDescriptions[] = {
    {.kernel = AttentionBackwardKernel::portable,
     .name = "portable",
     .dkdv = {kPortableSource, "kiln::attention_backward_dkdv_portable", kParams,
              attention_portable_constants(),
              [](const KernelSpec& spec) {
                const ParsedSpec s = parse(spec);
                return portable_dkdv_bytes(s.problem, s.config);
              },
              attention_operand_dtypes()},
     .dq = {kPortableSource, "kiln::attention_backward_dq_portable", kParams,
            attention_portable_constants(),
            [](const KernelSpec& spec) {
              const ParsedSpec s = parse(spec);
              return portable_dq_bytes(s.problem, s.config);
            },
            attention_operand_dtypes()},
     .threads = [](const AttentionBackwardConfig& c) { return c.warps * 32; },
     .dkdv_shared_bytes = portable_dkdv_bytes,
     .dq_shared_bytes = portable_dq_bytes},
};

// The most block_m and block_n of a config, and its most warps (a CTA of 1024 threads).
constexpr int kMaxBlock = 1024;
constexpr int kMaxWarps = 32;

KernelSpec dot_spec(const AttentionProblem& problem) {
  KernelSpec spec = spec_of(kBackwardDotKernel.schema);
  spec.set("dtype_out", problem.dtype_out)
      .set("head_dim_v", problem.head_dim_v)
      .set("varlen", problem.varlen);
  return spec;
}

}  // namespace

const FixedKernel kBackwardDotKernel{
    .schema = {"attention/backward/dot.cuh", "kiln::attention_backward_dot", kParams, kDotConstants,
               no_shared_memory},
    .threads = kAttentionBackwardDotThreads};
const FixedKernel kBackwardSinksKernel{.schema = {"attention/backward/dot.cuh",
                                                  "kiln::attention_backward_sinks",
                                                  kParams,
                                                  {},
                                                  no_shared_memory},
                                       .threads = kAttentionBackwardSinksThreads};

const AttentionBackwardDescription& describe(AttentionBackwardKernel kernel) {
  for (const AttentionBackwardDescription& d : kDescriptions) {
    if (d.kernel == kernel) return d;
  }
  invalid(fmt::format("config.kernel is {}, which is no AttentionBackwardKernel: use portable",
                      static_cast<int>(kernel)));
}

std::vector<const KernelSchema*> attention_backward_schemas() {
  std::vector<const KernelSchema*> schemas{&kBackwardDotKernel.schema,
                                           &kBackwardSinksKernel.schema};
  for (const AttentionBackwardDescription& d : kDescriptions) {
    schemas.push_back(&d.dkdv);
    schemas.push_back(&d.dq);
  }
  return schemas;
}

void check_config(const AttentionBackwardConfig& config, const Target& target) {
  describe(config.kernel);
  require_target(target, AttentionKernel::portable);
  const auto in = [](int value, int most) { return value >= 1 && value <= most; };
  if (!in(config.block_m, kMaxBlock) || !in(config.block_n, kMaxBlock) ||
      !in(config.warps, kMaxWarps)) {
    invalid(fmt::format(
        "backward config (block_m {}, block_n {}, warps {}) has a value out of range: block_m "
        "and block_n must be from 1 to {}, warps from 1 to {} (a CTA has at most {} threads)",
        config.block_m, config.block_n, config.warps, kMaxBlock, kMaxWarps, kMaxWarps * 32));
  }
}

AttentionBackwardPlan attention_backward_plan(const AttentionBackwardProblem& problem,
                                              const AttentionBackwardConfig& config) {
  const AttentionBackwardDescription& d = describe(config.kernel);
  const int threads = d.threads(config);
  AttentionBackwardPlan plan{
      .dot = {.spec = dot_spec(problem.forward), .threads = kBackwardDotKernel.threads},
      .sinks = std::nullopt,
      .dkdv = {.spec = attention_family_spec(d.dkdv, problem.forward, forward_config(config)),
               .threads = threads,
               .shared_bytes = d.dkdv_shared_bytes(problem.forward, config)},
      .dq = {.spec = attention_family_spec(d.dq, problem.forward, forward_config(config)),
             .threads = threads,
             .shared_bytes = d.dq_shared_bytes(problem.forward, config)}};
  if (problem.dsinks) {
    plan.sinks = LaunchPlan{.spec = spec_of(kBackwardSinksKernel.schema),
                            .threads = kBackwardSinksKernel.threads};
  }
  return plan;
}

void require_fits(const AttentionBackwardPlan& plan, const AttentionBackwardConfig& config,
                  const DeviceInfo& device) {
  for (const LaunchPlan* launch : {&plan.dkdv, &plan.dq}) {
    if (const auto exceeded = exceeded_limit(*launch, device)) {
      unsupported(fmt::format(
          "backward config (kernel {}, block_m {}, block_n {}, warps {}) needs {}: pass a config "
          "with a smaller block_m or block_n, or fewer warps (or choose()'s config, where this "
          "one is not)",
          describe(config.kernel).name, config.block_m, config.block_n, config.warps, *exceeded));
    }
  }
}

}  // namespace detail

// One config for every problem until the tensor-core kernels come.
AttentionBackwardConfig choose(const AttentionBackwardProblem& /*problem*/, const Target& target) {
  detail::require_target(target, AttentionKernel::portable);
  return {};
}

std::vector<KernelSpec> attention_backward_specs(const AttentionBackwardProblem& problem,
                                                 const AttentionBackwardConfig& config) {
  const detail::AttentionBackwardPlan plan = detail::attention_backward_plan(problem, config);
  std::vector<KernelSpec> specs{plan.dot.spec};
  if (plan.sinks) specs.push_back(plan.sinks->spec);
  specs.push_back(plan.dkdv.spec);
  specs.push_back(plan.dq.spec);
  return specs;
}

std::vector<KernelSpec> attention_backward_default_specs(const Target& target) {
  std::vector<KernelSpec> specs;
  if (!detail::attention_runs_on(target)) return specs;
  for (const detail::OperandDTypes& dtypes : detail::attention_operand_dtypes()) {
    for (int dim : {64, 128, 256}) {
      for (bool band : {false, true}) {
        const AttentionBackwardProblem problem{.forward = {.dtype_q = dtypes.q,
                                                           .dtype_kv = dtypes.kv,
                                                           .dtype_out = dtypes.out,
                                                           .head_dim = dim,
                                                           .head_dim_v = dim,
                                                           .band = band},
                                               .dsinks = true};  // its kernel too
        for (KernelSpec& spec : attention_backward_specs(problem, choose(problem, target))) {
          if (std::find(specs.begin(), specs.end(), spec) == specs.end()) {
            specs.push_back(std::move(spec));
          }
        }
      }
    }
  }
  return specs;
}

}  // namespace kiln
