// SPDX-License-Identifier: Apache-2.0
// LaunchPlan: what a family's (problem, config) launches, and whether a device can run it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

// One kernel launch as its family plans it from (problem, config): the spec to compile and the
// CTA the kernel declares. The launch reads it, and is_supported() checks it against the device.
struct LaunchPlan {
  KernelSpec spec;
  int threads = 0;             // per CTA
  long long shared_bytes = 0;  // dynamic shared memory per CTA
};

// What of `plan` `device` cannot run, as "N threads per CTA, but device D (NAME) runs at most
// M"; nullopt when it fits, or where the driver did not report the limit. A couple of compares
// when it fits: the hot path asks before each launch.
std::optional<std::string> exceeded_limit(const LaunchPlan& plan, const DeviceInfo& device);

// The runtime's device, or null for a runtime without one (compile-only use), which has no
// limits to check.
const DeviceInfo* present_device(Runtime& runtime);

// A call that runs on the device, as each interface names it: "kiln::attention" in C++,
// "kiln_attention" in the C API.
struct CallName {
  std::string_view cpp, c;
};

// The target `call` chooses its kernels for: the runtime's. With neither a device nor a
// configured target, kiln::Error (not_found) "CALL needs a GPU: WHY", not the runtime's advice
// to give a target, which compiles but cannot make a call run.
Target target_to_run(Runtime& runtime, CallName call);

// The runtime's device, on which `call` runs (`spec`, when given); without one, kiln::Error
// (not_found) "CALL needs a GPU to run SPEC: WHY".
const DeviceInfo& require_gpu(Runtime& runtime, CallName call, const KernelSpec* spec = nullptr);

}  // namespace kiln::detail
