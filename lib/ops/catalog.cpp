// SPDX-License-Identifier: Apache-2.0
// The default warm-up set: what a model's attention (forward and backward) and decode calls ask
// for most.
#include "kiln/kiln.hpp"

#include <fmt/format.h>

namespace kiln {

std::vector<KernelSpec> default_specs(const Target& target) {
  std::vector<KernelSpec> specs = attention_default_specs(target);
  for (KernelSpec& spec : attention_backward_default_specs(target))
    specs.push_back(std::move(spec));
  for (KernelSpec& spec : decode_default_specs(target)) specs.push_back(std::move(spec));
  // NOTE: an empty set would warm nothing and report success, without ever asking the target's
  // compiler whether it builds for the target.
  if (specs.empty()) {
    throw Error(ErrorCategory::unsupported,
                fmt::format("no default kernel runs on {}: attention and decode need an NVIDIA "
                            "sm_80 or newer target, or an AMD gfx9 one (wave64, such as gfx90a); "
                            "warm a manifest of the kernels you use instead",
                            target.name()));
  }
  for (KernelSpec& spec : specs) spec.target = target.name();
  return specs;
}

}  // namespace kiln
