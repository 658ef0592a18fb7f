// SPDX-License-Identifier: Apache-2.0
// Tests of the cache's upkeep: leftovers of killed publishers, full disks, listings while
// another process evicts, and links where shard directories belong.
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/disk.hpp"
#include "cache/entries.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;
using test::contains;
using test::entry_path;
using test::files_under;
using test::read_file;
using test::sample_entry;
using test::set_mtime;
using test::TempDir;
using test::write_file;

// Two hours ago: stale for a temp file.
std::int64_t two_hours_ago() {
  return static_cast<std::int64_t>(std::time(nullptr)) - 2 * 3600;
}

// A writable tier with two entries and the leftovers of publishers killed at work: temp files
// an hour old and fresh, beside an entry, the compiler memo and the root's probe, and lock
// files, one of them held.
struct Leftover {
  TempDir dir;
  fs::path root = dir.path() / "cache";
  DiskCache cache{DiskCacheConfig{root}};
  Entry a = sample_entry(70);
  Entry b = sample_entry(71);
  fs::path version;
  fs::path stale_temp, fresh_temp, memo_temp, probe_temp, free_lock, held_lock;
  std::optional<DiskCache::Lock> held;

  Leftover() {
    REQUIRE(cache.writable());
    cache.store(a);
    cache.store(b);
    cache.write_note("compilers/cuda.json", "{}");
    const fs::path shard = entry_path(root, a.key).parent_path();
    version = shard.parent_path();
    stale_temp = shard / (a.key.hex() + ".kbin.4242.0.tmp");
    fresh_temp = shard / (a.key.hex() + ".kbin.4242.1.tmp");
    memo_temp = version / "compilers" / "cuda.json.4242.2.tmp";
    probe_temp = version / "probe.4242.3.tmp";
    for (const fs::path& temp : {stale_temp, fresh_temp, memo_temp, probe_temp}) {
      write_file(temp, "partial");
      if (temp != fresh_temp) set_mtime(temp, two_hours_ago());
    }
    { const DiskCache::Lock lock = cache.lock(a.key); }
    held = cache.lock(b.key);
    free_lock = shard / (a.key.hex() + ".lock");
    held_lock = entry_path(root, b.key).parent_path() / (b.key.hex() + ".lock");
    REQUIRE(fs::exists(free_lock));
    REQUIRE(fs::exists(held_lock));
  }

  std::uint64_t entry_bytes() const {
    return fs::file_size(entry_path(root, a.key)) + fs::file_size(entry_path(root, b.key));
  }
};

TEST_CASE("leftovers are counted, in number and in the size eviction works to", "[cache]") {
  Leftover left;
  const Leftovers found = left.cache.leftovers();
  CHECK(found.temps == 4);
  CHECK(found.temp_bytes == 4 * std::string("partial").size());
  CHECK(found.locks == 2);
  CHECK(left.cache.size_bytes() == left.entry_bytes() + found.temp_bytes);
}

TEST_CASE("prune, and a store over the cap, remove stale temp files and lock files no one holds",
          "[cache]") {
  Leftover left;
  SECTION("prune") {
    CHECK(left.cache.prune(1 << 30) == 0);
  }
  SECTION("a store over the cap") {
    DiskCache capped(DiskCacheConfig{left.root, {}, 1 << 30});
    capped.store(sample_entry(72));
  }
  for (const fs::path& gone : {left.stale_temp, left.memo_temp, left.probe_temp, left.free_lock}) {
    CAPTURE(gone);
    CHECK_FALSE(fs::exists(gone));
  }
  // Still in use: a publisher's temp file of the last hour, and a lock a process holds.
  CHECK(fs::exists(left.fresh_temp));
  CHECK(fs::exists(left.held_lock));
  CHECK(fs::exists(entry_path(left.root, left.a.key)));
  CHECK(fs::exists(entry_path(left.root, left.b.key)));
  CHECK(left.cache.leftovers().temps == 1);
  CHECK(left.cache.leftovers().locks == 1);
}

TEST_CASE("temp files count toward the cap, so entries make room for them", "[cache]") {
  Leftover left;
  write_file(left.fresh_temp, std::string(4096, 'x'));
  CHECK(left.cache.prune(left.entry_bytes()) == 2);
  CHECK(files_under(left.root, ".kbin").empty());
}

TEST_CASE("clear removes every temp file and lock file, the compiler memo's included", "[cache]") {
  Leftover left;
  CHECK(left.cache.clear() == 2);
  CHECK(files_under(left.root) == std::vector<fs::path>{left.version / "compilers" / "cuda.json"});
  CHECK(left.cache.leftovers().temps == 0);
  CHECK(left.cache.leftovers().locks == 0);
}

TEST_CASE("a link or a file where a shard directory belongs is named, and removed, never followed",
          "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCache cache(DiskCacheConfig{root});
  const Entry entry = sample_entry(73);
  cache.store(entry);
  const fs::path version = entry_path(root, entry.key).parent_path().parent_path();
  const fs::path outside = dir.path() / "outside";
  fs::create_directory(outside);
  write_file(outside / "keep.kbin", "not the cache's");
  const fs::path link = version / "ab";
  const fs::path file = version / "cd";
  REQUIRE_FALSE(fs::exists(link));  // neither is the entry's shard
  REQUIRE_FALSE(fs::exists(file));
  fs::create_directory_symlink(outside, link);
  write_file(file, "not a directory");

  std::vector<EntryStatus> listed = cache.list(true);
  REQUIRE(listed.size() == 3);
  for (const EntryStatus& status : listed) {
    CAPTURE(status.path);
    if (status.path == link) {
      CHECK_FALSE(status.valid);
      CHECK(contains(status.problem, "symbolic link"));
      CHECK(contains(status.problem, "remove the link"));
    } else if (status.path == file) {
      CHECK_FALSE(status.valid);
      CHECK(contains(status.problem, "not a directory"));
    } else {
      CHECK(status.valid);
    }
  }
  SECTION("remove_invalid") {
    CHECK(cache.remove_invalid() == 2);
  }
  SECTION("clear") {
    CHECK(cache.clear() == 1);
  }
  CHECK_FALSE(fs::exists(fs::symlink_status(link)));
  CHECK_FALSE(fs::exists(file));
  CHECK(read_file(outside / "keep.kbin") == "not the cache's");
}

TEST_CASE("entries that another process removes during a listing are left out, not bad",
          "[cache]") {
  using std::chrono::steady_clock;
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  std::vector<Entry> entries;
  for (int seed = 0; seed < 64; ++seed) {
    entries.push_back(sample_entry(100 + seed));
    cache.store(entries.back());
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Evicts and stores again, over and over, as concurrent stores under a cap would.
    DiskCache churn(DiskCacheConfig{dir.path()});
    const auto end = steady_clock::now() + std::chrono::milliseconds(1500);
    while (steady_clock::now() < end) {
      for (const Entry& entry : entries) {
        churn.remove(entry.key);
        churn.store(entry);
      }
    }
    ::_exit(0);
  }
  REQUIRE(pid > 0);
  std::size_t listings = 0;
  std::vector<std::string> bad;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    for (const EntryStatus& listed : cache.list(true)) {
      if (!listed.valid) bad.push_back(listed.path.string() + ": " + listed.problem);
    }
    ++listings;
  }
  CHECK(WIFEXITED(status));
  CHECK(listings > 0);
  CAPTURE(bad);
  CHECK(bad.empty());
}

// Runs `body` in a child process with its own mount namespace, where `dir` is a new tmpfs of
// `inodes` inodes. Returns the child's exit status: body's result, or 77 when this machine lets
// no test mount a file system.
template <class Body>
int in_small_tmpfs(const fs::path& dir, int inodes, Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // NOTE: root may make a mount namespace; anyone else needs a user namespace for it.
    if (::unshare(CLONE_NEWNS) != 0 && ::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) ::_exit(77);
    // NOTE: private, so that the mount stays in this namespace.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) ::_exit(77);
    const std::string options = fmt::format("size=4m,nr_inodes={},mode=0700", inodes);
    if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, options.c_str()) != 0) ::_exit(77);
    ::_exit(body());
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST_CASE("with no inode left, the cache still opens, and lists, prunes and clears", "[cache]") {
  TempDir dir;
  const int result = in_small_tmpfs(dir.path(), 64, [&] {
    const fs::path root = dir.path() / "cache";
    const Entry a = sample_entry(80);
    const Entry b = sample_entry(81);
    {
      DiskCache cache(DiskCacheConfig{root});
      cache.store(a);
      cache.store(b);
      { const DiskCache::Lock lock = cache.lock(a.key); }
    }
    // Fills every inode left.
    for (int i = 0;; ++i) {
      const int fd = ::open((dir.path() / fmt::format("fill{}", i)).c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0) {
        if (errno != ENOSPC) return 1;
        break;
      }
      ::close(fd);
    }
    DiskCache cache(DiskCacheConfig{root});
    if (!cache.writable()) return 2;
    const std::vector<EntryStatus> listed = cache.list(true);
    if (listed.size() != 2 || !listed[0].valid || !listed[1].valid) return 3;
    if (cache.leftovers().locks != 1) return 4;
    if (cache.prune(fs::file_size(entry_path(root, a.key))) != 1) return 5;
    if (cache.clear() != 1 || !files_under(root).empty()) return 6;
    return 0;
  });
  if (result == 77) {
    WARN("skipped: this machine lets no test mount a file system");
    return;
  }
  INFO("1: could not fill the inodes; 2: memory-only; 3: list; 4: leftovers; 5: prune; 6: clear");
  CHECK(result == 0);
}

}  // namespace
}  // namespace kiln::detail
