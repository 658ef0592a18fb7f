// SPDX-License-Identifier: Apache-2.0
// Tests of the disk cache's entries: round trips, the documented layout, and damaged files.
#include "cache/disk.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "cache/entries.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using test::CapturedStderr;
using test::contains;
using test::entry_path;
using test::read_file;
using test::sample_entry;
using test::TempDir;
using test::write_file;

unsigned mode_of(const fs::path& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return info.st_mode & 07777;
}

TEST_CASE("a miss, then a store, then a hit with the same metadata and bytes", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(DiskCacheConfig{root, {}, 0});
  REQUIRE(cache.writable());
  CHECK(cache.root() == root);
  const Entry entry = sample_entry(1);
  CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
  cache.store(entry);
  const std::optional<Entry> loaded = cache.load(entry.key, entry.meta.spec);
  REQUIRE(loaded);
  test::check_same_entry(*loaded, entry);
  CHECK_FALSE(cache.load(sample_entry(2).key, sample_entry(2).meta.spec));
}

TEST_CASE("binaries of odd sizes round-trip byte for byte", "[cache]") {
  const std::size_t size = GENERATE(0, 1, 17, 113, 1023, (1 << 20) + 3);
  CAPTURE(size);
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(static_cast<int>(size % 97), size);
  cache.store(entry);
  const std::optional<Entry> loaded = cache.load(entry.key, entry.meta.spec);
  REQUIRE(loaded);
  test::check_same_entry(*loaded, entry);
}

TEST_CASE("a compile log that is not UTF-8 still stores and loads", "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  Entry entry = sample_entry(5);
  entry.meta.log = "bad byte \xff\xfe here";
  cache.store(entry);
  const std::optional<Entry> loaded = cache.load(entry.key, entry.meta.spec);
  REQUIRE(loaded);
  CHECK(contains(loaded->meta.log, "bad byte "));
  CHECK(loaded->binary == entry.binary);
}

TEST_CASE("entries live at <root>/v<format>/<2 hex>/<32 hex>.kbin in 0700 directories", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "made" / "by" / "kiln";
  DiskCache cache(DiskCacheConfig{root});
  const Entry entry = sample_entry(7);
  cache.store(entry);

  const std::string hex = entry.key.hex();
  const fs::path version = root / fmt::format("v{}", kCacheFormatVersion);
  const fs::path path = version / hex.substr(0, 2) / (hex + ".kbin");
  REQUIRE(fs::is_regular_file(fs::symlink_status(path)));
  CHECK(test::files_under(root) == std::vector<fs::path>{path});
  for (const fs::path& made :
       {dir.path() / "made", dir.path() / "made" / "by", root, version, path.parent_path()}) {
    CAPTURE(made);
    CHECK(mode_of(made) == 0700);
  }

  // The header, read by the documented offsets.
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() > test::kHeaderBytes);
  CHECK(bytes.substr(0, 8) == std::string("KILNBIN\0", 8));
  CHECK(test::get_u32(bytes, test::kVersionAt) == kCacheFormatVersion);
  CHECK(test::get_u32(bytes, test::kHeaderSizeAt) == test::kHeaderBytes);
  CHECK(bytes.substr(test::kKeyAt, 16) ==
        std::string(reinterpret_cast<const char*>(entry.key.bytes.data()), 16));
  CHECK(test::get_u64(bytes, test::kPayloadBytesAt) == bytes.size() - test::kHeaderBytes);
  const auto meta = nlohmann::json::parse(test::read_meta(path));
  CHECK(meta.at("spec") == entry.meta.spec);
  CHECK(meta.at("registers") == entry.meta.registers);
  CHECK(bytes.substr(bytes.size() - entry.binary.size()) ==
        std::string(reinterpret_cast<const char*>(entry.binary.data()), entry.binary.size()));
}

TEST_CASE("a hit in the writable tier refreshes the entry's last-used stamp", "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(8);
  cache.store(entry);
  const fs::path path = entry_path(dir.path(), entry.key);
  test::set_mtime(path, 1000);
  const auto before = std::chrono::system_clock::now() - std::chrono::seconds(60);
  REQUIRE(cache.load(entry.key, entry.meta.spec));
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(before.time_since_epoch()).count();
  CHECK(test::mtime_ns(path) > now_ns);
}

TEST_CASE("remove() drops the writable tier's entry", "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(9);
  cache.store(entry);
  cache.remove(entry.key);
  CHECK_FALSE(fs::exists(entry_path(dir.path(), entry.key)));
  CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
}

// Damages `entry`'s stored file with `damage`, then checks that loading it is a miss that warns
// with the path and `phrase`, removes the file, and that storing again brings the entry back.
template <class Damage>
void check_damage_is_a_miss(const Entry& entry, Damage damage, const std::string& phrase) {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  cache.store(entry);
  const fs::path path = entry_path(dir.path(), entry.key);
  std::string bytes = read_file(path);
  damage(bytes);
  write_file(path, bytes);
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
    const std::string warning = captured.text();
    CHECK(contains(warning, path.string()));
    CHECK(contains(warning, phrase));
  }
  CHECK_FALSE(fs::exists(path));
  cache.store(entry);
  const std::optional<Entry> again = cache.load(entry.key, entry.meta.spec);
  REQUIRE(again);
  CHECK(again->binary == entry.binary);
}

TEST_CASE("a corrupted payload byte is a miss that warns and removes the file", "[cache]") {
  const Entry entry = sample_entry(10);
  SECTION("in the binary") {
    check_damage_is_a_miss(
        entry, [](std::string& bytes) { bytes.back() ^= 0x5a; }, "checksum");
  }
  SECTION("in the metadata") {
    check_damage_is_a_miss(
        entry, [](std::string& bytes) { bytes[test::kHeaderBytes + 3] ^= 0x01; }, "checksum");
  }
}

TEST_CASE("a truncated entry is a miss", "[cache]") {
  const std::size_t header = test::kHeaderBytes;
  // Empty, inside the header, the header alone, inside the metadata.
  const std::size_t keep =
      GENERATE_COPY(as<std::size_t>{}, 0, 1, 8, header - 1, header, header + 5);
  CAPTURE(keep);
  check_damage_is_a_miss(
      sample_entry(11), [&](std::string& bytes) { bytes.resize(keep); }, "truncated");
}

TEST_CASE("an entry one byte short is a miss", "[cache]") {
  check_damage_is_a_miss(
      sample_entry(12), [](std::string& bytes) { bytes.pop_back(); }, "truncated");
}

TEST_CASE("a damaged header field is a miss", "[cache]") {
  const Entry entry = sample_entry(13);
  SECTION("magic") {
    check_damage_is_a_miss(
        entry, [](std::string& bytes) { bytes[3] = 'X'; }, "magic");
  }
  SECTION("a foreign format version") {
    check_damage_is_a_miss(
        entry,
        [](std::string& bytes) { test::put_u32(bytes, test::kVersionAt, kCacheFormatVersion + 1); },
        "format version " + std::to_string(kCacheFormatVersion + 1));
  }
  SECTION("header size") {
    check_damage_is_a_miss(
        entry, [](std::string& bytes) { test::put_u32(bytes, test::kHeaderSizeAt, 64); },
        "header size");
  }
  SECTION("payload length") {
    check_damage_is_a_miss(
        entry,
        [](std::string& bytes) {
          test::put_u64(bytes, test::kPayloadBytesAt,
                        test::get_u64(bytes, test::kPayloadBytesAt) - 1);
        },
        "payload bytes");
  }
  SECTION("metadata length beyond the payload") {
    check_damage_is_a_miss(
        entry,
        [](std::string& bytes) {
          test::put_u64(bytes, test::kMetaBytesAt, test::get_u64(bytes, test::kPayloadBytesAt) + 1);
        },
        "metadata length");
  }
  SECTION("checksum") {
    check_damage_is_a_miss(
        entry, [](std::string& bytes) { bytes[test::kChecksumAt] ^= 0x10; }, "checksum");
  }
}

TEST_CASE("flipping any single byte of an entry makes it a miss", "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(14, 17);
  cache.store(entry);
  const fs::path path = entry_path(dir.path(), entry.key);
  const std::string good = read_file(path);
  CapturedStderr captured;  // one warning for the path, not one per byte
  for (std::size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    write_file(path, bad);
    CAPTURE(at);
    REQUIRE_FALSE(cache.load(entry.key, entry.meta.spec));
  }
  write_file(path, good);
  CHECK(cache.load(entry.key, entry.meta.spec));
  CHECK(test::count_of(captured.text(), path.string()) == 1);
}

TEST_CASE("an entry copied to another key's path is a miss (key echo)", "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry a = sample_entry(15);
  const Entry b = sample_entry(16);
  cache.store(a);
  cache.store(b);
  const fs::path path_b = entry_path(dir.path(), b.key);
  write_file(path_b, read_file(entry_path(dir.path(), a.key)));
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.load(b.key, b.meta.spec));
    const std::string warning = captured.text();
    CHECK(contains(warning, path_b.string()));
    CHECK(contains(warning, a.key.hex()));
  }
  CHECK_FALSE(fs::exists(path_b));
  CHECK(cache.load(a.key, a.meta.spec));
}

TEST_CASE("an entry copied under another key, key echo and all, is a miss (recorded spec)",
          "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry a = sample_entry(18);
  const Entry b = sample_entry(19);
  cache.store(a);
  cache.store(b);
  // The key echo is outside the checksum: patched, the copy passes every check of the bytes.
  std::string copy = read_file(entry_path(dir.path(), a.key));
  copy.replace(test::kKeyAt, b.key.bytes.size(), reinterpret_cast<const char*>(b.key.bytes.data()),
               b.key.bytes.size());
  const fs::path path_b = entry_path(dir.path(), b.key);
  write_file(path_b, copy);
  {
    CapturedStderr captured;
    CHECK_FALSE(cache.load(b.key, b.meta.spec));
    const std::string warning = captured.text();
    CHECK(test::count_of(warning, "kiln warn:") == 1);
    CHECK(contains(warning, path_b.string()));
    CHECK(contains(warning, "another spec than the one asked for"));
  }
  CHECK_FALSE(fs::exists(path_b));  // so that it is compiled and stored again
  cache.store(b);
  CHECK(cache.load(b.key, b.meta.spec));
  CHECK(cache.load(a.key, a.meta.spec));
}

TEST_CASE("metadata that names its kernel inconsistently is a miss, and invalid to list",
          "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(20);
  cache.store(entry);
  const fs::path path = entry_path(dir.path(), entry.key);
  const auto [field, value, phrase] =
      GENERATE(std::tuple{"spec", "not a spec", "not a kernel spec"},
               // Constants out of order: to_string never prints this.
               std::tuple{"spec",
                          "elementwise/unary.cuh:kiln::unary<op=20,block_size=256,dtype=f16,"
                          "items_per_thread=4>(kiln::UnaryParams) @sm_90a",
                          "not in canonical form"},
               std::tuple{"target", "sm_80", "another target"});
  CAPTURE(field, value);
  nlohmann::json meta = nlohmann::json::parse(test::read_meta(path));
  meta[field] = value;
  test::rewrite_meta(path, meta.dump());

  const std::vector<EntryStatus> listed = cache.list(true);
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed[0].valid);
  CHECK(contains(listed[0].problem, phrase));
  CapturedStderr captured;
  CHECK_FALSE(cache.load(entry.key, meta["spec"].get<std::string>()));
  CHECK(contains(captured.text(), phrase));
  CHECK_FALSE(fs::exists(path));
}

TEST_CASE("metadata that is not a valid EntryMeta object is a miss, checksum notwithstanding",
          "[cache]") {
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(17);
  cache.store(entry);
  const fs::path path = entry_path(dir.path(), entry.key);
  const std::string good = test::read_meta(path);

  // The crafting itself is sound: the same metadata, rewritten, still loads.
  test::rewrite_meta(path, good);
  REQUIRE(cache.load(entry.key, entry.meta.spec));

  const auto with = [&](const char* field, const nlohmann::json& value) {
    nlohmann::json meta = nlohmann::json::parse(good);
    if (value.is_discarded()) {
      meta.erase(field);
    } else {
      meta[field] = value;
    }
    return meta.dump();
  };
  const nlohmann::json absent(nlohmann::json::value_t::discarded);
  const std::string bad = GENERATE_COPY(
      std::string("{not json"), std::string(), std::string("[1, 2, 3]"), good + "}",
      good.substr(0, good.size() - 1), with("registers", "forty"), with("registers", 1e300),
      with("registers", 99999999999), with("spill_bytes", -99999999999), with("spec", 5),
      with("compile_ms", "fast"), with("log", absent));
  CAPTURE(bad);
  test::rewrite_meta(path, bad);
  CapturedStderr captured;
  CHECK_FALSE(cache.load(entry.key, entry.meta.spec));
  CHECK(contains(captured.text(), "metadata"));
  CHECK_FALSE(fs::exists(path));
}

}  // namespace
}  // namespace kiln::detail
