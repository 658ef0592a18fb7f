// Which backend builds a target.
#include "backend/backend.hpp"

namespace kiln::detail {

std::string_view vendor_of_target(std::string_view target) noexcept {
  if (target.starts_with("sm_") || target.starts_with("compute_")) return "cuda";
  if (target.starts_with("gfx")) return "hip";
  return {};
}

}  // namespace kiln::detail
