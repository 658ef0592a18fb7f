// SPDX-License-Identifier: Apache-2.0
// Tests for the compiler fact memo: its JSON round trip, what it refuses, and when it is current.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/compiler_memo.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

CompilerMemo sample(const fs::path& library) {
  const std::vector<std::string> candidates = {"libexample.so.1", "/opt/example/libexample.so"};
  CompilerMemo memo;
  memo.loader = loader_signature(candidates);
  memo.library = stamp_of(library).value();
  memo.identity = "example 1.2";
  memo.targets["sm_90a"] = {true, {"--gpu-architecture=sm_90a", "-std=c++17"}};
  memo.targets["sm_1"] = {false, {}};
  return memo;
}

TEST_CASE("a compiler memo prints as JSON and parses back", "[backend]") {
  const test::TempDir dir;
  test::write_file(dir.path() / "libexample.so", "not really a library");
  const CompilerMemo memo = sample(dir.path() / "libexample.so");
  const std::optional<CompilerMemo> parsed = parse_memo(print_memo(memo));
  REQUIRE(parsed);
  CHECK(*parsed == memo);
  CHECK(json::parse(print_memo(memo))["identity"] == "example 1.2");
}

TEST_CASE("anything but a memo of this format parses as nothing", "[backend]") {
  const test::TempDir dir;
  test::write_file(dir.path() / "libexample.so", "not really a library");
  const json good = json::parse(print_memo(sample(dir.path() / "libexample.so")));
  std::vector<std::string> texts = {"", "{", "[]", "null", "{\"memo\": 1}", "\x01\xff garbage"};
  const auto with = [&](const char* field, json value) {
    json changed = good;
    changed[field] = std::move(value);
    texts.push_back(changed.dump());
  };
  with("memo", 1);  // whose hipRTC accepted gfx names comgr cannot build
  with("memo", 3);
  with("memo", "2");
  with("identity", 13);
  with("targets", json::array({"sm_90a"}));
  with("library", json::object({{"file", "/x"}, {"size", "big"}, {"mtime_ns", 1}}));
  json missing = good;
  missing.erase("loader");
  texts.push_back(missing.dump());
  for (const std::string& text : texts) {
    INFO(text);
    CHECK_FALSE(parse_memo(text));
  }
}

TEST_CASE("a memo is current only while its library and the loader signature are unchanged",
          "[backend]") {
  const test::TempDir dir;
  const fs::path library = dir.path() / "libexample.so";
  test::write_file(library, "version one");
  const CompilerMemo memo = sample(library);
  const std::vector<std::string> candidates = {"libexample.so.1", "/opt/example/libexample.so"};
  CHECK(memo_is_current(memo, loader_signature(candidates)));

  SECTION("another candidate list (CUDA_HOME, ROCM_PATH) is another signature") {
    const std::vector<std::string> other = {"/toolkit/lib64/libexample.so.1", "libexample.so.1"};
    CHECK_FALSE(memo_is_current(memo, loader_signature(other)));
  }
  SECTION("another LD_LIBRARY_PATH is another signature") {
    const test::ScopedEnv path("LD_LIBRARY_PATH", "/somewhere/else");
    CHECK_FALSE(memo_is_current(memo, loader_signature(candidates)));
  }
  SECTION("a library of another size") {
    test::write_file(library, "version two, longer");
    CHECK_FALSE(memo_is_current(memo, loader_signature(candidates)));
  }
  SECTION("a library with another modification time") {
    fs::last_write_time(library, fs::last_write_time(library) - std::chrono::seconds(5));
    CHECK_FALSE(memo_is_current(memo, loader_signature(candidates)));
  }
  SECTION("a library that is gone") {
    fs::remove(library);
    CHECK_FALSE(memo_is_current(memo, loader_signature(candidates)));
  }
  SECTION("a memo that names no library") {
    CompilerMemo unnamed = memo;
    unnamed.library = {};
    CHECK_FALSE(memo_is_current(unnamed, loader_signature(candidates)));
  }
}

}  // namespace
}  // namespace kiln::detail
