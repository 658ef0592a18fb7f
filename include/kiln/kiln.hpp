// kiln: run-time compiled GPU kernels. Include this for the whole public C++ API.
#pragma once

#include <string_view>
#include <vector>

#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "kiln/score.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// The specs `kiln warm` compiles when given no manifest: every family's default set, for
// `target` (sm_90a, gfx90a). A family that does not support the target contributes nothing.
std::vector<KernelSpec> default_specs(const Target& target);

}  // namespace kiln
