// SPDX-License-Identifier: Apache-2.0
// kiln: run-time compiled GPU kernels. Include this for the whole public C++ API.
#pragma once

#include <string_view>
#include <vector>

#include "kiln/attention.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/decode.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "kiln/score.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// The specs `kiln warm` (given no manifest) and kiln_warmup compile: the attention (forward and
// backward) and decode families' default sets, for `target` (sm_90a, gfx90a); a family that does
// not support the target contributes nothing, and a target none supports is refused (unsupported).
// The elementwise kernels are opt-in, as few programs call them: unary_default_specs(), `kiln warm
// --elementwise`.
std::vector<KernelSpec> default_specs(const Target& target);

}  // namespace kiln
