// SPDX-License-Identifier: Apache-2.0
// Tests for the HIP driver backend that run without an AMD GPU.
#include <catch2/catch.hpp>

#include "backend/backend.hpp"
#include "kiln/error.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {
namespace {

TEST_CASE("open_hip_driver works or names the HIP runtime", "[backend]") {
  try {
    const auto driver = open_hip_driver();
    CHECK(driver->vendor() == Vendor::amd);
    CHECK_THAT(driver->version(), Catch::Matches("hip driver [0-9]+\\.[0-9]+\\.[0-9]+"));
    CHECK(driver->device_count() >= 0);
    for (int ordinal = 0; ordinal < driver->device_count(); ++ordinal) {
      const DeviceInfo info = driver->device(ordinal);
      CHECK_FALSE(info.name.empty());
      CHECK((info.target.empty() || Target(info.target).amd()));
    }
    try {
      driver->device(driver->device_count());
      FAIL("a device past the last did not throw");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::not_found);
      CHECK_THAT(e.what(), Catch::Contains("HIP_VISIBLE_DEVICES"));
    }
    const std::vector<std::byte> garbage(64, std::byte{0});
    CHECK_THROWS_AS(driver->load(driver->device_count(), garbage, "_Z1kv"), Error);
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("ROCM_PATH"));
  }
}

}  // namespace
}  // namespace kiln::detail
