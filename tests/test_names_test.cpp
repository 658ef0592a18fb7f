// SPDX-License-Identifier: Apache-2.0
// The test cases' names, which ctest takes as one entry each (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <string>

namespace kiln::test {
namespace {

TEST_CASE("every test case's name makes one ctest entry that runs it", "[tests]") {
  // NOTE: catch_discover_tests reads the names as a CMake list: a ';' splits one into two
  // entries that each match nothing (and pass, running nothing), and an unbalanced '[' joins the
  // names after it into one.
  for (const Catch::TestCase& test : Catch::getRegistryHub().getTestCaseRegistry().getAllTests()) {
    const std::string& name = test.getTestCaseInfo().name;
    INFO(name);
    CHECK(name.find_first_of(";[]") == std::string::npos);
  }
}

}  // namespace
}  // namespace kiln::test
