// SPDX-License-Identifier: Apache-2.0
// Tests for DynLib: which candidate opens, and what the errors say when none does.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

#include "backend/dynlib.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

std::string message_of_open(std::span<const std::string> candidates) {
  try {
    DynLib::open("libexample", candidates, "install example or set EXAMPLE_HOME");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    return e.what();
  }
  FAIL("DynLib::open succeeded with no loadable candidate");
  return {};
}

TEST_CASE("DynLib names every candidate and the fix when none loads", "[backend]") {
  const std::array<std::string, 2> candidates = {"libkiln-no-such-library.so.1",
                                                 "/nonexistent/dir/libkiln-no-such-library.so"};
  const std::string message = message_of_open(candidates);
  CHECK_THAT(message, Catch::Contains("libexample not found"));
  CHECK_THAT(message, Catch::Contains(candidates[0]));
  CHECK_THAT(message, Catch::Contains(candidates[1]));
  CHECK_THAT(message, Catch::Contains("install example or set EXAMPLE_HOME"));
  CHECK_THAT(message, !Catch::Contains("No such file"));
}

TEST_CASE("DynLib shows why a file that exists did not load", "[backend]") {
  const test::TempDir dir;
  const std::filesystem::path fake = dir.path() / "libfake.so";
  test::write_file(fake, "not an ELF file");
  const std::array<std::string, 1> candidates = {fake.string()};
  const std::string message = message_of_open(candidates);
  CHECK_THAT(message, Catch::Contains(fake.string()));
  CHECK_THAT(message, Catch::Contains("; "));  // the loader's reason follows the candidates
}

TEST_CASE("DynLib opens the first loadable candidate and finds its symbols", "[backend]") {
  const std::array<std::string, 2> candidates = {"libkiln-no-such-library.so", "libc.so.6"};
  DynLib libc = DynLib::open("libc", candidates, "install a C library");
  CHECK(libc.file().is_absolute());
  CHECK(std::filesystem::exists(libc.file()));

  using Strlen = std::size_t (*)(const char*);
  CHECK(libc.symbol<Strlen>("strlen")("kiln") == 4);
  CHECK(libc.find("kiln_no_such_symbol") == nullptr);
  try {
    libc.symbol<Strlen>("kiln_no_such_symbol");
    FAIL("a missing symbol did not throw");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("kiln_no_such_symbol"));
    CHECK_THAT(e.what(), Catch::Contains(libc.file().string()));
    CHECK_THAT(e.what(), Catch::Contains("install a C library"));
  }

  const DynLib moved = std::move(libc);
  CHECK(moved.find("strlen") != nullptr);
}

TEST_CASE("DynLib binds optional symbols, and names a missing one only when it is used",
          "[backend]") {
  const std::array<std::string, 1> candidates = {"libc.so.6"};
  const DynLib libc = DynLib::open("libc", candidates, "install a C library");
  using Strlen = std::size_t (*)(const char*);
  Strlen present = nullptr;
  libc.bind_optional(present, "strlen");
  REQUIRE(present != nullptr);
  CHECK(present("kiln") == 4);
  CHECK_NOTHROW(libc.require_bound(present, "strlen"));

  Strlen missing = &std::strlen;
  libc.bind_optional(missing, "kiln_no_such_symbol");
  CHECK(missing == nullptr);
  try {
    libc.require_bound(missing, "kiln_no_such_symbol");
    FAIL("a missing optional symbol did not throw when required");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("kiln_no_such_symbol"));
    CHECK_THAT(e.what(), Catch::Contains("install a C library"));
  }
}

TEST_CASE("library_candidates puts user directories first and defaults last", "[backend]") {
  const std::array<std::string_view, 2> names = {"liba.so.2", "liba.so"};
  const std::array<std::filesystem::path, 2> user_dirs = {"/user", ""};
  const std::array<std::filesystem::path, 1> default_dirs = {"/default"};
  const std::vector<std::string> expected = {"/user/liba.so.2",    "/user/liba.so",
                                             "liba.so.2",          "liba.so",
                                             "/default/liba.so.2", "/default/liba.so"};
  CHECK(library_candidates(names, user_dirs, default_dirs) == expected);
}

TEST_CASE("env_path is empty unless the variable names a directory", "[backend]") {
  {
    const test::ScopedEnv unset("KILN_TEST_DIR", nullptr);
    CHECK(env_path("KILN_TEST_DIR", "lib64").empty());
  }
  {
    const test::ScopedEnv empty("KILN_TEST_DIR", "");
    CHECK(env_path("KILN_TEST_DIR", "lib64").empty());
  }
  const test::ScopedEnv set("KILN_TEST_DIR", "/opt/toolkit");
  CHECK(env_path("KILN_TEST_DIR", "lib64") == std::filesystem::path("/opt/toolkit/lib64"));
}

}  // namespace
}  // namespace kiln::detail
