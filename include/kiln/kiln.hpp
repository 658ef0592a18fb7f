// kiln: run-time compiled GPU kernels. Include this for the whole public C++ API.
#pragma once

#include <vector>

#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"

namespace kiln {

// The specs `kiln warm` compiles when given no manifest: every family's default set.
std::vector<KernelSpec> default_specs();

}  // namespace kiln
