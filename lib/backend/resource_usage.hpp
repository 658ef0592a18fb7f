// SPDX-License-Identifier: Apache-2.0
// Registers, spills, shared memory and stack of one kernel, read from a compiler's log.
#pragma once

#include <string_view>

#include "backend/backend.hpp"

namespace kiln::detail {

// From `-Xptxas=-v` output. Only the entry `lowered_name` is read when the log names it, since
// one unit can hold several kernels; otherwise the first entry. -1 for anything not reported.
ResourceUsage parse_ptxas_usage(std::string_view log, std::string_view lowered_name);

// From the AMDGPU backend's `-Rpass-analysis=kernel-resource-usage` remarks, with the same
// choice of entry. Registers are VGPRs; spill bytes count spilled VGPRs (4 bytes per lane each),
// since spilled SGPRs land in VGPR lanes, not memory.
ResourceUsage parse_amdgpu_usage(std::string_view log, std::string_view lowered_name);

}  // namespace kiln::detail
