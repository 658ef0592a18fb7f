// SPDX-License-Identifier: Apache-2.0
// What hipRTC and the HIP driver share: where ROCm's libraries live and how HIP writes versions.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::detail {

// `names` looked for in $ROCM_PATH/lib first, then on the loader's path, then in /opt/rocm/lib.
std::vector<std::string> rocm_library_candidates(std::span<const std::string_view> names);

// Whether `target` names an AMD GPU architecture (kiln::Target): gfx90a, gfx942, gfx1100.
bool is_gfx_target(std::string_view target);

// HIP_VERSION encoding (major * 10^7 + minor * 10^5 + patch) as "5.2.21153".
std::string hip_version_text(int version);

inline constexpr std::string_view kRocmFix =
    "install ROCm's HIP runtime and hipRTC (libamdhip64, libhiprtc) or set ROCM_PATH to the ROCm "
    "directory";

}  // namespace kiln::detail
