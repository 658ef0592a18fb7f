// SPDX-License-Identifier: Apache-2.0
// What every kernel's description shares: specs from a schema, and constants read back from one.
#include "kernels/kernel.hpp"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln::detail {

void invalid(const std::string& message) {
  throw Error(ErrorCategory::invalid_argument, message);
}

void unsupported(const std::string& message) {
  throw Error(ErrorCategory::unsupported, message);
}

bool is_sm80_or_newer(const Target& target) {
  return target.nvidia() && target.arch() >= 80;
}

void set_variant(KernelSpec& spec, const Variant* variant) {
  if (variant == nullptr) return;
  spec.variant_name = variant->name;
  spec.variant_code = variant->code;
}
KernelSpec spec_of(const KernelSchema& schema) {
  return {.source = std::string(schema.source),
          .entry = std::string(schema.entry),
          .params = std::string(schema.params)};
}

bool takes(const KernelSchema& schema, std::string_view name) {
  return std::any_of(schema.constants.begin(), schema.constants.end(),
                     [&](const ConstantSchema& c) { return c.name == name; });
}

long long integer_constant(const KernelSpec& spec, std::string_view name) {
  const auto it = std::find_if(spec.constants.begin(), spec.constants.end(),
                               [&](const Constant& c) { return c.name == name; });
  return std::get<std::int64_t>(it->value);
}

long long no_shared_memory(const KernelSpec&) {
  return 0;
}

std::optional<std::string> exceeded_limit(const LaunchPlan& plan, const DeviceInfo& device) {
  const auto over = [](long long needed, int limit) { return limit > 0 && needed > limit; };
  if (over(plan.threads, device.max_threads_per_block)) {
    return fmt::format("{} threads per CTA, but device {} ({}) runs at most {}", plan.threads,
                       device.ordinal, device.name, device.max_threads_per_block);
  }
  if (over(plan.shared_bytes, device.max_shared_bytes_per_block)) {
    return fmt::format(
        "{} bytes of dynamic shared memory per CTA, but device {} ({}) allows at most {}",
        plan.shared_bytes, device.ordinal, device.name, device.max_shared_bytes_per_block);
  }
  return std::nullopt;
}

}  // namespace kiln::detail
