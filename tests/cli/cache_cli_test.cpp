// SPDX-License-Identifier: Apache-2.0
// Tests of `kiln cache` (and `kiln warm`) against caches in odd states, made by hand.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/disk.hpp"
#include "cache/entries.hpp"
#include "cli/run_kiln.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// A scratch directory whose cache/ holds two entries stored by the library.
struct Stored {
  TempDir scratch;
  fs::path cache = scratch.path() / "cache";
  detail::Entry a = sample_entry(90);
  detail::Entry b = sample_entry(91);

  Stored() {
    detail::DiskCache disk(detail::DiskCacheConfig{cache});
    REQUIRE(disk.writable());
    disk.store(a);
    disk.store(b);
  }
  fs::path version() const { return entry_path(cache, a.key).parent_path().parent_path(); }
  Result run(std::vector<std::string> args) const { return run_kiln(scratch.path(), cache, args); }
};

TEST_CASE("kiln cache and kiln warm refuse a cache that others can write, naming the fix",
          "[cli]") {
  const Stored stored;
  const fs::path shard = entry_path(stored.cache, stored.a.key).parent_path();
  REQUIRE(::chmod(shard.c_str(), 0777) == 0);
  const std::vector<std::string> command =
      GENERATE(std::vector<std::string>{"cache", "ls"}, std::vector<std::string>{"cache", "verify"},
               std::vector<std::string>{"cache", "prune", "--max-bytes", "1G"},
               std::vector<std::string>{"cache", "clear"},
               std::vector<std::string>{"warm", "--target", "sm_90a", "--quiet"});
  CAPTURE(command);
  const Result result = stored.run(command);
  CHECK(result.code == 1);
  CHECK(contains(result.err, "kiln: error: the cache directory " + stored.cache.string() +
                                 " is not safe to use: " + shard.string() +
                                 " is writable by group and others (mode 0777)"));
  CHECK(contains(result.err, "chmod go-w " + shard.string()));
  CHECK(fs::exists(entry_path(stored.cache, stored.a.key)));
}

TEST_CASE("kiln cache verify names a linked shard directory, and --fix and clear remove the link",
          "[cli]") {
  const Stored stored;
  const fs::path outside = stored.scratch.path() / "outside";
  fs::create_directory(outside);
  write_file(outside / "keep", "not the cache's");
  const fs::path link = stored.version() / "ab";
  REQUIRE_FALSE(fs::exists(link));  // no entry's shard
  fs::create_directory_symlink(outside, link);

  const Result found = stored.run({"cache", "verify"});
  CHECK(found.code == 1);
  CHECK(contains(found.out, "bad: " + link.string() + ": it is a symbolic link"));
  CHECK(contains(found.out, "remove the link"));
  CHECK(contains(found.out, "3 entries checked, 1 bad"));

  const std::vector<std::string> fix =
      GENERATE(std::vector<std::string>{"cache", "verify", "--fix"},
               std::vector<std::string>{"cache", "clear"});
  CAPTURE(fix);
  CHECK(stored.run(fix).code == 0);
  CHECK_FALSE(fs::exists(fs::symlink_status(link)));
  CHECK(read_file(outside / "keep") == "not the cache's");
}

TEST_CASE("kiln cache ls counts temp files, not lock files, and clear removes both", "[cli]") {
  const Stored stored;
  const fs::path shard = entry_path(stored.cache, stored.a.key).parent_path();
  write_file(shard / (stored.a.key.hex() + ".kbin.4242.0.tmp"), "partial");
  write_file(shard / (stored.a.key.hex() + ".lock"), "");
  REQUIRE(::mkdir((stored.version() / "compilers").c_str(), 0700) == 0);
  write_file(stored.version() / "compilers" / "cuda.json.4242.1.tmp", "{}");

  const Result listed = stored.run({"cache", "ls"});
  CHECK(listed.code == 0);
  CHECK(contains(listed.out, "2 entries"));
  CHECK(contains(listed.out,
                 "also 2 temp files (9 B) of stores under way or killed (`kiln cache prune` "
                 "removes those an hour old, `kiln cache clear` all)\n"));
  CHECK_FALSE(contains(listed.out, "lock file"));

  CHECK(stored.run({"cache", "clear"}).code == 0);
  CHECK(files_under(stored.cache).empty());
  CHECK_FALSE(contains(stored.run({"cache", "ls"}).out, "temp files"));
}

}  // namespace
}  // namespace kiln::test
