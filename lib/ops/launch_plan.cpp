// SPDX-License-Identifier: Apache-2.0
// LaunchPlan against a device's limits.
#include "ops/launch_plan.hpp"

#include <fmt/format.h>

#include "core/config.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

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

const DeviceInfo* present_device(Runtime& runtime) {
  try {
    return &runtime.device_info();
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::not_found) throw;
    return nullptr;
  }
}

Target target_to_run(Runtime& runtime, CallName call) {
  try {
    return runtime.target();
  } catch (const Error& e) {
    // Without a device, that is what to say; with one, the runtime's own error stands.
    if (e.category() == ErrorCategory::not_found) require_gpu(runtime, call);
    throw;
  }
}

const DeviceInfo& require_gpu(Runtime& runtime, CallName call, const KernelSpec* spec) {
  try {
    return runtime.device_info();
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::not_found) throw;
    const std::string_view name = current_interface() == Interface::c ? call.c : call.cpp;
    throw Error(ErrorCategory::not_found,
                spec ? fmt::format("{} needs a GPU to run {}: {}", name, to_string(*spec), e.what())
                     : fmt::format("{} needs a GPU: {}", name, e.what()));
  }
}

}  // namespace kiln::detail
