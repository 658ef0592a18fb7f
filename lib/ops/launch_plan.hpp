// SPDX-License-Identifier: Apache-2.0
// Where a call runs: the runtime's target and device, as each interface names the call.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "kernels/kernel.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

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
