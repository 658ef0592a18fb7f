// Where ROCm's libraries live and how HIP writes versions.
#include "backend/rocm.hpp"

#include <algorithm>
#include <array>
#include <filesystem>

#include "backend/dynlib.hpp"

namespace kiln::detail {

std::vector<std::string> rocm_library_candidates(std::span<const std::string_view> names) {
  const std::array<std::filesystem::path, 1> user_dirs = {env_path("ROCM_PATH", "lib")};
  const std::array<std::filesystem::path, 1> default_dirs = {"/opt/rocm/lib"};
  return library_candidates(names, user_dirs, default_dirs);
}

bool is_gfx_target(std::string_view target) {
  constexpr std::string_view prefix = "gfx";
  if (!target.starts_with(prefix)) return false;
  target.remove_prefix(prefix.size());
  const auto is_lower_alnum = [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z');
  };
  return target.size() >= 3 && target.size() <= 4 &&
         std::all_of(target.begin(), target.end(), is_lower_alnum);
}

std::string hip_version_text(int version) {
  return std::to_string(version / 10000000) + "." + std::to_string(version / 100000 % 100) + "." +
         std::to_string(version % 100000);
}

}  // namespace kiln::detail
