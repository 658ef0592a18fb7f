// SPDX-License-Identifier: Apache-2.0
// Tests for LazyCompiler over a stand-in compiler whose library is libc: answers from the memo,
// loads counted, a memo corrected by the real compiler, no memo without a disk cache.
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/lazy_compiler.hpp"
#include "kiln/error.hpp"
#include "runtime/disk_memos.hpp"
#include "stub_compiler.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// What the stand-in compiler says it is: a test changes it to play a compiler upgrade.
std::string installed_identity = "stand-in 1.0";

CompilerLibrary stand_in(std::vector<std::string> candidates = {"libc.so.6"}) {
  return {Vendor::nvidia, "the stand-in compiler", std::move(candidates), "nothing to fix",
          [](DynLib) -> std::unique_ptr<Compiler> {
            return std::make_unique<test::StubCompiler>(Vendor::nvidia, installed_identity);
          }};
}

fs::path memo_file(const fs::path& cache) {
  return cache / "v1" / "compilers" / "cuda.json";
}

TEST_CASE("LazyCompiler answers from its memo without loading the library", "[backend]") {
  const test::TempDir dir;
  DiskCache disk({dir.path(), {}, 0});
  DiskMemos memos(disk);
  installed_identity = "stand-in 1.0";
  std::uint64_t opens = compiler_library_opens();
  {
    const LazyCompiler first(stand_in(), memos);
    CHECK(first.accepts("sm_90a"));
    CHECK(compiler_library_opens() == ++opens);
  }
  REQUIRE(fs::exists(memo_file(dir.path())));

  const LazyCompiler second(stand_in(), memos);
  CHECK(second.identity() == "stand-in 1.0");
  CHECK(second.accepts("sm_90a"));
  CHECK(second.canonical_options("sm_90a") == std::vector<std::string>{"--arch=sm_90a"});
  CHECK(compiler_library_opens() == opens);

  // A target the memo has not seen is asked of the real compiler and added.
  CHECK_FALSE(second.accepts("gfx90a"));
  CHECK(compiler_library_opens() == ++opens);
  const LazyCompiler third(stand_in(), memos);
  CHECK_FALSE(third.accepts("gfx90a"));
  CHECK(third.accepts("sm_90a"));
  CHECK(compiler_library_opens() == opens);

  // Only the message refusing a target lists them all, so that is left to the real compiler.
  CHECK(third.targets() == std::vector<Target>{"sm_80", "sm_90a"});
  CHECK(compiler_library_opens() == ++opens);
}

TEST_CASE("loading the real compiler corrects a memo that names another identity", "[backend]") {
  const test::TempDir dir;
  DiskCache disk({dir.path(), {}, 0});
  DiskMemos memos(disk);
  installed_identity = "stand-in 1.0";
  CHECK(LazyCompiler(stand_in(), memos).accepts("sm_90a"));

  installed_identity = "stand-in 2.0";  // same file, so the memo still looks current
  const LazyCompiler lazy(stand_in(), memos);
  CHECK(lazy.identity() == "stand-in 1.0");
  CHECK(lazy.real().identity() == "stand-in 2.0");
  CHECK(lazy.identity() == "stand-in 2.0");
  CHECK(lazy.accepts("sm_90a"));
  CHECK(json::parse(test::read_file(memo_file(dir.path())))["identity"] == "stand-in 2.0");
  installed_identity = "stand-in 1.0";
}

TEST_CASE("a memory-only cache keeps no memo, so every LazyCompiler loads", "[backend]") {
  DiskCache disk({std::nullopt, {}, 0});
  DiskMemos memos(disk);
  const std::uint64_t opens = compiler_library_opens();
  CHECK(LazyCompiler(stand_in(), memos).accepts("sm_90a"));
  CHECK(LazyCompiler(stand_in(), memos).accepts("sm_90a"));
  CHECK(compiler_library_opens() == opens + 2);
}

TEST_CASE("a library that cannot be loaded is an error every time it is needed", "[backend]") {
  const test::TempDir dir;
  DiskCache disk({dir.path(), {}, 0});
  DiskMemos memos(disk);
  const LazyCompiler lazy(stand_in({"libkiln-no-such-compiler.so"}), memos);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      lazy.identity();
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::not_found);
      CHECK_THAT(e.what(), Catch::Contains("libkiln-no-such-compiler.so"));
    }
  }
  CHECK_FALSE(fs::exists(memo_file(dir.path())));
}

}  // namespace
}  // namespace kiln::detail
