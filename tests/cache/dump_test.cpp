// SPDX-License-Identifier: Apache-2.0
// Where the units of failed compiles go: a directory only the user may write, files only the
// user may read, never through a link or into a FIFO, and only the newest few kept.
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/entries.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "runtime/processes.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::test::contains;
using kiln::test::read_file;
using kiln::test::write_file;

// A kernel tree whose elementwise unit does not compile, and a temp directory (TMPDIR) of the
// test's own, sticky and writable by everyone as /tmp is.
struct BrokenCompile {
  kiln::test::TempDir dir;
  fs::path temp = dir.path() / "tmp";
  fs::path victim = dir.path() / "victim";
  kiln::Options options = kiln::test::isolated_options(dir.path() / "cache", "sm_90a");

  BrokenCompile() {
    fs::create_directory(temp);
    REQUIRE(::chmod(temp.c_str(), 01777) == 0);
    fs::copy(fs::path(KILN_SOURCE_DIR) / "kernels_src", dir.path() / "k",
             fs::copy_options::recursive);
    const fs::path kernel = dir.path() / "k" / "elementwise" / "unary.cuh";
    write_file(kernel, read_file(kernel) + "\nthis is not C++;\n");
    options.kernels_dir = dir.path() / "k";
    write_file(victim, "the victim's file");
  }

  // The failure of a compile in a fresh runtime (so not remembered from the last).
  kiln::CompileFailure fail() const {
    const kiln::test::ScopedEnv tmpdir("TMPDIR", temp.c_str());
    const kiln::test::ScopedEnv no_dump("KILN_DUMP_DIR", nullptr);
    kiln::Runtime rt(options);
    try {
      rt.compile(kiln::unary_spec(kiln::UnaryOp::exp, kiln::DType::f32, {256, 4}));
    } catch (const kiln::CompileError& e) {
      return e.failure();
    }
    FAIL("the broken unit compiled");
    return {};
  }

  fs::path private_dir() const { return temp / ("kiln-" + std::to_string(::geteuid())); }
  // Where the unit of the compile of key `key` used to go, for anyone to plant something first.
  fs::path predictable(const std::string& key) const { return temp / ("kiln_" + key + ".cu"); }
};

struct stat lstat_of(const fs::path& path) {
  struct stat info {};
  REQUIRE(::lstat(path.c_str(), &info) == 0);
  return info;
}

}  // namespace

TEST_CASE("a failed compile's unit goes to a private directory, 0600, never through a link",
          "[cache][runtime]") {
  BrokenCompile broken;
  const kiln::CompileFailure first = broken.fail();
  const fs::path unit = broken.private_dir() / ("kiln_" + first.key + ".cu");
  CHECK(first.source_path == unit.string());
  CHECK(contains(read_file(unit), "struct kiln_spec"));
  CHECK((lstat_of(unit).st_mode & 07777) == 0600);  // it holds the user's variant code
  CHECK((lstat_of(broken.private_dir()).st_mode & 07777) == 0700);

  // Links planted where the unit goes, or used to go in the shared temp directory.
  fs::remove(unit);
  fs::create_symlink(broken.victim, unit);
  fs::create_symlink(broken.victim, broken.predictable(first.key));
  const kiln::CompileFailure again = broken.fail();
  CHECK(again.source_path == unit.string());
  CHECK(read_file(broken.victim) == "the victim's file");
  CHECK(S_ISREG(lstat_of(unit).st_mode));
  CHECK(contains(read_file(unit), "struct kiln_spec"));
}

TEST_CASE("another user's directory under the private name is refused, with one warning",
          "[cache][runtime]") {
  BrokenCompile broken;
  const std::string key = broken.fail().key;
  fs::remove_all(broken.private_dir());
  // Made by another user before this one's first failure, with a link to the victim's file.
  fs::create_directory(broken.private_dir());
  fs::create_symlink(broken.victim, broken.private_dir() / ("kiln_" + key + ".cu"));
  const std::string refusal = kiln::test::make_foreign(broken.private_dir());

  kiln::test::CapturedStderr captured;
  CHECK(broken.fail().source_path.empty());
  CHECK(broken.fail().source_path.empty());
  CHECK(read_file(broken.victim) == "the victim's file");
  const std::string text = captured.text();
  INFO(text);
  CHECK(kiln::test::count_of(text, "kiln warn:") == 1);
  CHECK(contains(text, refusal));
  CHECK(contains(text, "KILN_DUMP_DIR"));
}

TEST_CASE("a FIFO where a failed compile's unit goes does not stop the compile",
          "[cache][runtime]") {
  BrokenCompile broken;
  const kiln::CompileFailure first = broken.fail();
  const fs::path unit = broken.private_dir() / ("kiln_" + first.key + ".cu");
  fs::create_directories(broken.private_dir());  // NOTE: made by the first failure, once fixed
  for (const fs::path& path : {unit, broken.predictable(first.key)}) {
    fs::remove(path);
    REQUIRE(::mkfifo(path.c_str(), 0666) == 0);
  }
  // In a child, so that a compile that waits for a reader fails the test instead of hanging it.
  CHECK(kiln::test::in_process_within(std::chrono::seconds(30), [&] {
    return broken.fail().source_path == unit.string() && S_ISREG(lstat_of(unit).st_mode);
  }));
}

TEST_CASE("the private dump directory keeps only the newest failed units", "[cache][runtime]") {
  BrokenCompile broken;
  const kiln::CompileFailure first = broken.fail();
  // Older failures of other keys, and a file of the user's that is no failed unit.
  constexpr int kOlder = 20;
  fs::create_directories(broken.private_dir());  // NOTE: made by the first failure, once fixed
  for (int i = 0; i < kOlder; ++i) {
    const fs::path old = broken.private_dir() / fmt::format("kiln_{:032x}.cu", i);
    write_file(old, "an old unit");
    kiln::test::set_mtime(old, 1'000'000 + i);
  }
  write_file(broken.private_dir() / "notes.txt", "mine");
  broken.fail();
  std::vector<std::string> units;
  for (const fs::directory_entry& entry : fs::directory_iterator(broken.private_dir())) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("kiln_")) units.push_back(name);
  }
  INFO(fmt::format("{}", fmt::join(units, " ")));
  CHECK(units.size() == 16);
  CHECK(std::count(units.begin(), units.end(), "kiln_" + first.key + ".cu") == 1);  // the newest
  CHECK(std::count(units.begin(), units.end(), fmt::format("kiln_{:032x}.cu", kOlder - 1)) == 1);
  CHECK(std::count(units.begin(), units.end(), fmt::format("kiln_{:032x}.cu", 0)) == 0);
  CHECK(fs::exists(broken.private_dir() / "notes.txt"));
}
