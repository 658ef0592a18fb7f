// SPDX-License-Identifier: Apache-2.0
// Tests of whom the disk cache trusts: owners and modes of its files, its directories and those
// above them.
#include "cache/trust.hpp"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "cache/disk.hpp"
#include "cache/entries.hpp"
#include "core/config.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using test::CapturedStderr;
using test::contains;
using test::entry_path;
using test::sample_entry;
using test::TempDir;

struct stat dir_stat(uid_t owner, mode_t mode) {
  struct stat info {};
  info.st_uid = owner;
  info.st_mode = S_IFDIR | mode;
  return info;
}

void set_mode(const fs::path& path, mode_t mode) {
  REQUIRE(::chmod(path.c_str(), mode) == 0);
}

constexpr uid_t kMe = 1000;
constexpr uid_t kSomeoneElse = 1001;

TEST_CASE("a tier's directory must be the user's or root's, and writable by no one else",
          "[cache]") {
  const fs::path dir = "/some/cache";
  CHECK(untrusted_path(dir, dir_stat(kMe, 0700), kMe, TrustPlace::tier).empty());
  CHECK(untrusted_path(dir, dir_stat(kMe, 0755), kMe, TrustPlace::tier).empty());
  CHECK(untrusted_path(dir, dir_stat(0, 0755), kMe, TrustPlace::tier).empty());  // a system bundle

  const std::string foreign =
      untrusted_path(dir, dir_stat(kSomeoneElse, 0700), kMe, TrustPlace::tier);
  CHECK(contains(foreign, "/some/cache belongs to uid 1001, not to this user (uid 1000)"));
  CHECK(contains(foreign, "chown 1000 /some/cache"));

  const auto writers = [&](mode_t mode) {
    return untrusted_path(dir, dir_stat(kMe, mode), kMe, TrustPlace::tier);
  };
  CHECK(contains(writers(0770), "/some/cache is writable by group (mode 0770)"));
  CHECK(contains(writers(0707), "writable by others (mode 0707)"));
  CHECK(contains(writers(0777), "writable by group and others (mode 0777)"));
  CHECK(contains(writers(01777), "writable by group and others (mode 1777)"));  // sticky or not
  CHECK(contains(writers(0777), "chmod go-w /some/cache"));
  // Root's own directories are held to the same modes.
  CHECK_FALSE(untrusted_path(dir, dir_stat(0, 0777), 0, TrustPlace::tier).empty());
}

TEST_CASE("a tier's file must be the user's or root's, and writable by no one else", "[cache]") {
  const fs::path file = "/some/cache/v1/ab/entry.kbin";
  const auto file_stat = [](uid_t owner, mode_t mode) {
    struct stat info {};
    info.st_uid = owner;
    info.st_mode = S_IFREG | mode;
    return info;
  };
  CHECK(untrusted_path(file, file_stat(kMe, 0600), kMe, TrustPlace::file).empty());
  CHECK(untrusted_path(file, file_stat(kMe, 0644), kMe, TrustPlace::file).empty());
  CHECK(untrusted_path(file, file_stat(0, 0644), kMe, TrustPlace::file).empty());

  const std::string foreign =
      untrusted_path(file, file_stat(kSomeoneElse, 0644), kMe, TrustPlace::file);
  CHECK(contains(foreign, file.string() + " belongs to uid 1001, not to this user (uid 1000)"));
  CHECK(contains(foreign, "could rewrite the kernel binary in it"));
  CHECK(contains(foreign, "chown 1000 " + file.string()));

  const std::string open = untrusted_path(file, file_stat(kMe, 0666), kMe, TrustPlace::file);
  CHECK(contains(open, "writable by group and others (mode 0666)"));
  CHECK(contains(open, "chmod go-w " + file.string()));
  CHECK(contains(untrusted_path(file, file_stat(kMe, 0620), kMe, TrustPlace::file),
                 "writable by group (mode 0620)"));
}

TEST_CASE("a directory above a tier must not be writable by everyone unless sticky", "[cache]") {
  const fs::path dir = "/shared";
  CHECK(untrusted_path(dir, dir_stat(0, 0755), kMe, TrustPlace::above).empty());
  CHECK(untrusted_path(dir, dir_stat(0, 01777), kMe, TrustPlace::above).empty());  // /tmp
  CHECK(untrusted_path(dir, dir_stat(kSomeoneElse, 02775), kMe, TrustPlace::above).empty());
  const std::string open = untrusted_path(dir, dir_stat(kMe, 0777), kMe, TrustPlace::above);
  CHECK(contains(open, "/shared, above the cache, is writable by everyone and not sticky"));
  CHECK(contains(open, "chmod o-w /shared"));
}

// A store that the cache kept, in a root made for the test.
struct StoredCache {
  TempDir dir;
  fs::path root = dir.path() / "parent" / "cache";
  Entry entry = sample_entry(60);

  StoredCache() {
    DiskCache cache(DiskCacheConfig{root});
    REQUIRE(cache.writable());
    cache.store(entry);
    { const DiskCache::Lock lock = cache.lock(entry.key); }
    cache.write_note("compilers/cuda.json", "{}");
  }
  fs::path version() const { return entry_path(root, entry.key).parent_path().parent_path(); }
};

TEST_CASE("a root, or a directory below it, that others can write makes the cache memory-only",
          "[cache]") {
  StoredCache stored;
  const fs::path version = stored.version();
  const fs::path shard = entry_path(stored.root, stored.entry.key).parent_path();
  // NOTE: generated as indices, as a generator keeps the values of the first run's paths.
  const std::pair<fs::path, mode_t> cases[] = {{stored.root, 0777},
                                               {stored.root, 0770},
                                               {version, 0777},
                                               {shard, 0770},
                                               {shard, 0707},
                                               {version / "compilers", 0777},
                                               {stored.root.parent_path(), 0777}};
  const auto& [dir, mode] = cases[GENERATE(range(0, 7))];
  CAPTURE(dir, mode);
  set_mode(dir, mode);
  CapturedStderr captured;
  DiskCache cache(DiskCacheConfig{stored.root});
  DiskCache again(DiskCacheConfig{stored.root});
  CHECK_FALSE(cache.writable());
  CHECK_FALSE(again.writable());
  CHECK(contains(cache.untrusted(), dir.string()));
  CHECK_FALSE(cache.load(stored.entry.key, stored.entry.meta.spec));
  const std::string warning = captured.text();
  CHECK(test::count_of(warning, "kiln warn:") == 1);
  CHECK(contains(warning, "will not use " + stored.root.string() + " as the kernel cache"));
  const std::string fix = dir == stored.root.parent_path() ? "chmod o-w " : "chmod go-w ";
  CHECK(contains(warning, fix + dir.string()));
}

TEST_CASE("a sticky directory above the root, such as /tmp, is fine", "[cache]") {
  StoredCache stored;
  set_mode(stored.root.parent_path(), 01777);
  DiskCache cache(DiskCacheConfig{stored.root});
  CHECK(cache.writable());
  CHECK(cache.untrusted().empty());
  CHECK(cache.load(stored.entry.key, stored.entry.meta.spec));
}

TEST_CASE("a directory opened later is checked again before anything in it is read", "[cache]") {
  StoredCache stored;
  DiskCache cache(DiskCacheConfig{stored.root});
  REQUIRE(cache.writable());
  const fs::path shard = entry_path(stored.root, stored.entry.key).parent_path();
  set_mode(shard, 0777);
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.load(stored.entry.key, stored.entry.meta.spec));
    cache.store(stored.entry);
    CHECK(test::count_of(captured.text(), "chmod go-w " + shard.string()) == 1);
  }
  const std::vector<EntryStatus> listed = cache.list(true);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].path == shard);
  CHECK_FALSE(listed[0].valid);
  CHECK(contains(listed[0].problem, "chmod go-w " + shard.string()));

  set_mode(stored.version() / "compilers", 0777);
  CHECK_FALSE(cache.read_note("compilers/cuda.json"));
}

TEST_CASE("read-only tiers are held to the same rules unless trusted explicitly", "[cache]") {
  StoredCache bundle;
  const fs::path file = entry_path(bundle.root, bundle.entry.key);
  const fs::path shard = file.parent_path();
  // An entry file is checked as its directories are: 0666 is what `tar -p` of a umask 0 leaves.
  const std::pair<fs::path, mode_t> cases[] = {
      {bundle.root, 0775}, {bundle.version(), 0775}, {shard, 0775}, {file, 0666}};
  const auto& [dir, mode] = cases[GENERATE(range(0, 4))];
  CAPTURE(dir, mode);
  set_mode(dir, mode);
  TempDir local;
  const Entry& entry = bundle.entry;
  {
    CapturedStderr captured;
    DiskCache cache(DiskCacheConfig{local.path(), {bundle.root}});
    REQUIRE(cache.writable());
    CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
    CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
    const std::string warning = captured.text();
    CHECK(test::count_of(warning, "kiln warn:") == 1);
    CHECK(contains(warning, "chmod go-w " + dir.string()));
    if (dir == bundle.root || dir == file) CHECK(contains(warning, "KILN_CACHE_RO_TRUST=1"));
  }
  CHECK(fs::exists(file));  // a read-only tier is never changed
  DiskCache trusting(DiskCacheConfig{local.path(), {bundle.root}, 0, /*trust_ro_roots=*/true});
  CHECK(trusting.load(entry.key, entry.meta.spec));
}

TEST_CASE("an entry file that others can write is a miss, rebuilt, and bad to verify", "[cache]") {
  StoredCache stored;
  const fs::path path = entry_path(stored.root, stored.entry.key);
  set_mode(path, 0666);  // as `tar -p` leaves a file packed with a umask of 0
  DiskCache cache(DiskCacheConfig{stored.root});
  REQUIRE(cache.writable());

  const std::vector<EntryStatus> listed = cache.list(true);
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(contains(listed[0].problem, "chmod go-w " + path.string()));
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.load(stored.entry.key, stored.entry.meta.spec));
    CHECK_FALSE(cache.load(stored.entry.key, stored.entry.meta.spec));
    const std::string warning = captured.text();
    CHECK(test::count_of(warning, "kiln warn:") == 1);
    CHECK(contains(warning, "will not load the cache entry " + path.string()));
    CHECK(contains(warning, "writable by group and others (mode 0666)"));
    CHECK(contains(warning, "chmod go-w " + path.string()));
  }
  cache.store(stored.entry);  // as a miss does after compiling
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  CHECK((info.st_mode & (S_IWGRP | S_IWOTH)) == 0);
  CHECK(cache.load(stored.entry.key, stored.entry.meta.spec));
  CHECK(cache.list(true).at(0).valid);

  set_mode(path, 0620);
  CHECK(cache.remove_invalid() == 1);  // `kiln cache verify --fix`
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("a compiler memo that others can write is refused, then written again", "[cache]") {
  StoredCache stored;
  const fs::path note = stored.version() / "compilers" / "cuda.json";
  set_mode(note, 0666);
  DiskCache cache(DiskCacheConfig{stored.root});
  REQUIRE(cache.writable());
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.read_note("compilers/cuda.json"));
    const std::string warning = captured.text();
    CHECK(test::count_of(warning, "kiln warn:") == 1);
    CHECK(contains(warning, "chmod go-w " + note.string()));
  }
  cache.write_note("compilers/cuda.json", "{}");
  CHECK(cache.read_note("compilers/cuda.json") == "{}");
}

TEST_CASE("KILN_CACHE_RO_TRUST and Options::cache_ro_trust choose whether to trust read-only tiers",
          "[cache]") {
  {
    test::ScopedEnv unset("KILN_CACHE_RO_TRUST", nullptr);
    CHECK_FALSE(resolve_config({}).cache_ro_trust);
  }
  test::ScopedEnv trust("KILN_CACHE_RO_TRUST", "1");
  CHECK(resolve_config({}).cache_ro_trust);
  Options options;
  options.cache_ro_trust = false;
  CHECK_FALSE(resolve_config(options).cache_ro_trust);
  test::ScopedEnv bad("KILN_CACHE_RO_TRUST", "maybe");
  CHECK_THROWS_WITH(resolve_config({}), Catch::Contains("KILN_CACHE_RO_TRUST is 'maybe'"));
}

}  // namespace
}  // namespace kiln::detail
