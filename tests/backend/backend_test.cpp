// Tests for vendor_of_target.
#include <catch2/catch.hpp>

#include "backend/backend.hpp"

namespace kiln::detail {
namespace {

TEST_CASE("vendor_of_target tells CUDA from HIP targets", "[backend]") {
  CHECK(vendor_of_target("sm_90a") == "cuda");
  CHECK(vendor_of_target("sm_80") == "cuda");
  CHECK(vendor_of_target("compute_90") == "cuda");
  CHECK(vendor_of_target("gfx90a") == "hip");
  CHECK(vendor_of_target("gfx1100") == "hip");
  CHECK(vendor_of_target("").empty());
  CHECK(vendor_of_target("sm").empty());
  CHECK(vendor_of_target("x86_64").empty());
  CHECK(vendor_of_target("SM_90").empty());
}

}  // namespace
}  // namespace kiln::detail
