// SPDX-License-Identifier: Apache-2.0
// Where ROCm's libraries live and how HIP writes versions.
#include "backend/rocm.hpp"

#include <array>
#include <filesystem>
#include <optional>

#include "backend/dynlib.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

std::vector<std::string> rocm_library_candidates(std::span<const std::string_view> names) {
  const std::array<std::filesystem::path, 1> user_dirs = {env_path("ROCM_PATH", "lib")};
  const std::array<std::filesystem::path, 1> default_dirs = {"/opt/rocm/lib"};
  return library_candidates(names, user_dirs, default_dirs);
}

bool is_gfx_target(std::string_view target) {
  const std::optional<Target> parsed = Target::parse(target);
  return parsed && parsed->amd();
}

std::string hip_version_text(int version) {
  return std::to_string(version / 10000000) + "." + std::to_string(version / 100000 % 100) + "." +
         std::to_string(version % 100000);
}

}  // namespace kiln::detail
