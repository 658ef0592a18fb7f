// SPDX-License-Identifier: Apache-2.0
// Tests of the disk cache's tiers: the root, links, read-only tiers, eviction and maintenance.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk.hpp"
#include "cache/entries.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using test::CapturedStderr;
using test::contains;
using test::entry_path;
using test::files_under;
using test::read_file;
using test::sample_entry;
using test::TempDir;
using test::write_file;

TEST_CASE("an unusable root makes the cache memory-only, with one warning", "[cache]") {
  TempDir dir;
  write_file(dir.path() / "file", "not a directory");
  // NOTE: tests run as root, which ignores permission bits; a regular file as parent fails for
  // everyone (ENOTDIR).
  const fs::path root = dir.path() / "file" / "cache";
  CapturedStderr captured;
  DiskCache cache(DiskCacheConfig{root});
  DiskCache again(DiskCacheConfig{root});
  CHECK_FALSE(cache.writable());
  CHECK_FALSE(again.writable());

  const Entry entry = sample_entry(20);
  CHECK_NOTHROW(cache.store(entry));
  CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
  {
    // Memory-only locks are empty, so taking the same one twice does not wait.
    const DiskCache::Lock first = cache.lock(entry.key);
    const DiskCache::Lock second = cache.lock(entry.key);
  }
  CHECK(cache.list(true).empty());
  CHECK(cache.size_bytes() == 0);
  CHECK(cache.prune(0) == 0);
  CHECK(cache.clear() == 0);

  const std::string warning = captured.text();
  CHECK(test::count_of(warning, "KILN_CACHE_DIR") == 1);
  CHECK(contains(warning, root.string()));
  CHECK(files_under(dir.path()) == std::vector<fs::path>{dir.path() / "file"});
}

TEST_CASE("no root means memory-only, silently", "[cache]") {
  CapturedStderr captured;
  DiskCache cache(DiskCacheConfig{});
  CHECK_FALSE(cache.writable());
  CHECK_FALSE(cache.load(sample_entry(21).key, sample_entry(21).meta.spec));
  CHECK_NOTHROW(cache.store(sample_entry(21)));
  CHECK(captured.text().empty());
}

TEST_CASE("the root itself may be a symbolic link", "[cache]") {
  TempDir dir;
  fs::create_directory(dir.path() / "real");
  fs::create_directory_symlink(dir.path() / "real", dir.path() / "link");
  DiskCache cache(DiskCacheConfig{dir.path() / "link"});
  REQUIRE(cache.writable());
  const Entry entry = sample_entry(22);
  cache.store(entry);
  CHECK(fs::is_regular_file(entry_path(dir.path() / "real", entry.key)));
  CHECK(cache.load(entry.key, entry.meta.spec));
}

TEST_CASE("links below the root are never followed, to read or to write", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const fs::path outside = dir.path() / "outside";
  fs::create_directory(outside);
  const Entry entry = sample_entry(23);
  // A valid entry for the key, to plant outside the root: followed, the link would be a hit.
  DiskCache(DiskCacheConfig{dir.path() / "source"}).store(entry);
  const std::string valid = read_file(entry_path(dir.path() / "source", entry.key));
  const fs::path path = entry_path(root, entry.key);

  SECTION("a shard directory that links outside") {
    DiskCache cache(DiskCacheConfig{root});
    REQUIRE(cache.writable());
    const fs::path planted = outside / path.filename();
    write_file(planted, valid);
    fs::create_directory_symlink(outside, path.parent_path());
    CapturedStderr captured;
    CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
    cache.store(entry);
    { const DiskCache::Lock lock = cache.lock(entry.key); }
    CHECK(files_under(outside) == std::vector<fs::path>{planted});
    CHECK(read_file(planted) == valid);
    CHECK(fs::is_symlink(path.parent_path()));
    CHECK(contains(captured.text(), path.parent_path().string()));
    CHECK(contains(captured.text(), "symbolic link"));
  }
  SECTION("an entry that links outside") {
    DiskCache cache(DiskCacheConfig{root});
    const fs::path planted = outside / "planted.kbin";
    write_file(planted, valid);
    fs::create_directories(path.parent_path());
    fs::create_symlink(planted, path);
    {
      CapturedStderr captured;
      CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
      CHECK(contains(captured.text(), path.string()));
      CHECK(contains(captured.text(), "symbolic link"));
    }
    CHECK_FALSE(fs::exists(fs::symlink_status(path)));  // the link, not its target, was removed
    cache.store(entry);
    CHECK(fs::is_regular_file(fs::symlink_status(path)));
    CHECK(read_file(planted) == valid);
    CHECK(cache.load(entry.key, entry.meta.spec));
  }
  SECTION("a version directory that links outside") {
    fs::create_directory(root);
    fs::create_directory_symlink(outside, root / fmt::format("v{}", kCacheFormatVersion));
    CapturedStderr captured;
    DiskCache cache(DiskCacheConfig{root});
    CHECK_FALSE(cache.writable());
    cache.store(entry);
    CHECK(files_under(outside).empty());
    CHECK(contains(captured.text(), "symbolic link"));
  }
}

TEST_CASE("read-only tiers serve misses of the writable tier and are never changed", "[cache]") {
  TempDir dir;
  const fs::path bundle = dir.path() / "bundle";
  const Entry a = sample_entry(24);
  const Entry b = sample_entry(25);
  {
    DiskCache builder(DiskCacheConfig{bundle});
    builder.store(a);
    builder.store(b);
  }
  const fs::path ro_a = entry_path(bundle, a.key);
  test::set_mtime(ro_a, 1000);
  const fs::path local = dir.path() / "local";
  DiskCache cache(DiskCacheConfig{local, {dir.path() / "missing", bundle}});
  REQUIRE(cache.writable());
  CHECK(cache.ro_roots().size() == 2);

  SECTION("a hit from the read-only tier, not stamped and not copied") {
    const std::optional<Entry> loaded = cache.load(a.key, a.meta.spec);
    REQUIRE(loaded);
    test::check_same_entry(*loaded, a);
    CHECK(test::mtime_ns(ro_a) == 1000'000'000'000);
    CHECK_FALSE(fs::exists(entry_path(local, a.key)));
  }
  SECTION("the writable tier comes first") {
    Entry newer = a;
    newer.binary.assign(5, std::byte{0x42});
    cache.store(newer);
    const std::optional<Entry> loaded = cache.load(a.key, a.meta.spec);
    REQUIRE(loaded);
    CHECK(loaded->binary == newer.binary);
  }
  SECTION("a corrupt read-only entry is a miss and stays as it is") {
    std::string bytes = read_file(ro_a);
    bytes.back() ^= 1;
    write_file(ro_a, bytes);
    test::set_mtime(ro_a, 1000);
    CapturedStderr captured;
    CHECK_FALSE(cache.load(a.key, a.meta.spec));
    CHECK(contains(captured.text(), ro_a.string()));
    CHECK(read_file(ro_a) == bytes);
    CHECK(test::mtime_ns(ro_a) == 1000'000'000'000);
    // Maintenance works on the writable tier only.
    cache.remove_invalid();
    cache.prune(0);
    cache.clear();
    CHECK(read_file(ro_a) == bytes);
    CHECK(cache.load(b.key, b.meta.spec));
  }
}

TEST_CASE("with max_bytes, a store evicts the least recently used entries", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path();
  const Entry a = sample_entry(1);
  const Entry b = sample_entry(2);
  const Entry c = sample_entry(3);
  const Entry d = sample_entry(4);
  {
    DiskCache uncapped(DiskCacheConfig{root});
    for (const Entry* entry : {&a, &b, &c}) uncapped.store(*entry);
  }
  const std::uint64_t size = fs::file_size(entry_path(root, a.key));
  for (const Entry* entry : {&b, &c}) REQUIRE(fs::file_size(entry_path(root, entry->key)) == size);
  // Explicit stamps, oldest first: a, b, c. File times are too coarse to order quick stores.
  test::set_mtime(entry_path(root, a.key), 1000);
  test::set_mtime(entry_path(root, b.key), 2000);
  test::set_mtime(entry_path(root, c.key), 3000);

  DiskCache cache(DiskCacheConfig{root, {}, 3 * size});
  REQUIRE(cache.load(a.key, a.meta.spec));  // now the most recently used
  cache.store(d);
  CHECK(fs::exists(entry_path(root, a.key)));
  CHECK_FALSE(fs::exists(entry_path(root, b.key)));
  CHECK(fs::exists(entry_path(root, c.key)));
  CHECK(fs::exists(entry_path(root, d.key)));
  CHECK(cache.size_bytes() == 3 * size);

  SECTION("the entry just stored survives a cap smaller than itself") {
    DiskCache tiny(DiskCacheConfig{root, {}, 1});
    const Entry e = sample_entry(5);
    tiny.store(e);
    CHECK(files_under(root, ".kbin") == std::vector<fs::path>{entry_path(root, e.key)});
    CHECK(tiny.load(e.key, e.meta.spec));
  }
  SECTION("prune evicts down to its own cap and counts") {
    test::set_mtime(entry_path(root, d.key), 4000);
    test::set_mtime(entry_path(root, a.key), 5000);
    CHECK(cache.prune(size) == 2);
    CHECK(files_under(root, ".kbin") == std::vector<fs::path>{entry_path(root, a.key)});
  }
}

TEST_CASE("stores racing under a cap smaller than one entry leave exactly one", "[cache]") {
  // A capped store publishes and evicts under the tier's eviction lock, so two stores at once
  // cannot each remove the other's entry.
  for (int round = 0; round < 20; ++round) {
    TempDir dir;
    DiskCache first(DiskCacheConfig{dir.path(), {}, 1});
    DiskCache second(DiskCacheConfig{dir.path(), {}, 1});
    const Entry a = sample_entry(2 * round + 100);
    const Entry b = sample_entry(2 * round + 101);
    std::thread other([&] { second.store(b); });
    first.store(a);
    other.join();
    INFO("round " << round);
    CHECK(files_under(dir.path(), ".kbin").size() == 1);
  }
}

TEST_CASE("list, remove_invalid and clear maintain the writable tier", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(DiskCacheConfig{root});
  const Entry a = sample_entry(30);
  const Entry b = sample_entry(31);
  const Entry c = sample_entry(32);
  for (const Entry* entry : {&a, &b, &c}) cache.store(*entry);
  std::string damaged = read_file(entry_path(root, b.key));
  damaged.back() ^= 1;
  write_file(entry_path(root, b.key), damaged);
  const fs::path shard = entry_path(root, a.key).parent_path();
  const fs::path misnamed = shard / "not-a-key.kbin";
  write_file(misnamed, "x");
  const fs::path leftover = shard / (a.key.hex() + ".kbin.12345.0.tmp");
  write_file(leftover, "partial");
  { const DiskCache::Lock lock = cache.lock(c.key); }
  CHECK(fs::exists(entry_path(root, c.key).parent_path() / (c.key.hex() + ".lock")));

  const std::vector<EntryStatus> quick = cache.list(false);
  REQUIRE(quick.size() == 4);
  std::uint64_t total = 0;
  for (const EntryStatus& status : quick) {
    CAPTURE(status.path);
    CHECK(status.size == fs::file_size(status.path));
    CHECK(status.last_used == test::mtime_ns(status.path) / 1'000'000'000);
    CHECK_FALSE(status.valid);
    CHECK_FALSE(status.meta);
    if (status.key) CHECK(status.path == entry_path(root, *status.key));
    total += status.size;
  }
  CHECK(cache.size_bytes() == total + fs::file_size(leftover));  // temp files count too

  for (const EntryStatus& status : cache.list(true)) {
    CAPTURE(status.path);
    if (status.path == misnamed) {
      CHECK_FALSE(status.key);
      CHECK_FALSE(status.valid);
      CHECK(contains(status.problem, "name"));
    } else if (status.key == b.key) {
      CHECK_FALSE(status.valid);
      CHECK(contains(status.problem, "checksum"));
    } else {
      CHECK(status.valid);
      CHECK(status.problem.empty());
      REQUIRE(status.meta);
      CHECK(status.meta->spec == (status.key == a.key ? a : c).meta.spec);
    }
  }

  CHECK(cache.remove_invalid() == 2);
  CHECK_FALSE(fs::exists(entry_path(root, b.key)));
  CHECK_FALSE(fs::exists(misnamed));
  CHECK(cache.load(a.key, a.meta.spec));

  CHECK(cache.clear() == 2);
  CHECK(files_under(root).empty());
  CHECK(fs::is_directory(root));
  CHECK_FALSE(cache.load(a.key, a.meta.spec));
  cache.store(a);
  CHECK(cache.load(a.key, a.meta.spec));
}

TEST_CASE("other formats' directories are listed, and removed only on request", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(DiskCacheConfig{root});
  const Entry a = sample_entry(40);
  cache.store(a);
  const std::string ours = entry_path(root, a.key).parent_path().parent_path().filename();
  // Another kiln's entries and memo, a link to a directory outside, and look-alikes that are
  // not format directories.
  for (const char* sub : {"v0/ab", "v0/compilers", "v12/cd", "vx", "v"}) {
    fs::create_directories(root / sub);
  }
  write_file(root / "v0" / "ab" / (a.key.hex() + ".kbin"), "old entry");
  write_file(root / "v0" / "compilers" / "cuda.json", "{}");
  write_file(root / "v12" / "cd" / "x.kbin", "old entry");
  const fs::path outside = dir.path() / "outside";
  fs::create_directories(outside);
  write_file(outside / "keep", "not the cache's");
  fs::create_directory_symlink(outside, root / "v7");
  write_file(root / "v5", "a file, not a directory");

  CHECK(cache.other_formats() == std::vector<std::string>{"v0", "v12", "v7"});
  CHECK(cache.clear() == 1);  // this format's entries only
  CHECK(fs::exists(root / "v0" / "compilers" / "cuda.json"));

  CHECK(cache.remove_other_formats() == 3);
  CHECK(cache.other_formats().empty());
  CHECK_FALSE(fs::exists(root / "v0"));
  CHECK_FALSE(fs::exists(root / "v12"));
  CHECK_FALSE(fs::is_symlink(root / "v7"));
  CHECK(read_file(outside / "keep") == "not the cache's");
  CHECK(fs::exists(root / "v5"));
  CHECK(fs::is_directory(root / "vx"));
  CHECK(fs::is_directory(root / "v"));
  CHECK(fs::is_directory(root / ours));
  cache.store(a);
  CHECK(cache.load(a.key, a.meta.spec));
}

}  // namespace
}  // namespace kiln::detail
