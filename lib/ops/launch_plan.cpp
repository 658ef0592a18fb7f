// SPDX-License-Identifier: Apache-2.0
// Where a call runs: the runtime's target and device.
#include "ops/launch_plan.hpp"

#include <fmt/format.h>

#include "core/config.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

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
