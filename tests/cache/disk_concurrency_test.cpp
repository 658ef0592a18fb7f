// SPDX-License-Identifier: Apache-2.0
// Tests of the disk cache under concurrency: processes, threads, and the per-key lock.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <set>
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
using test::files_under;
using test::sample_entry;
using test::TempDir;

// Runs `body` in `count` forked children that start together once all exist; returns each
// child's exit status (-1 when it did not exit normally).
template <class Body>
std::vector<int> run_children(int count, Body body) {
  int start[2];
  REQUIRE(::pipe(start) == 0);
  std::vector<pid_t> children;
  for (int child = 0; child < count; ++child) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(start[1]);
      char go;
      const bool started = ::read(start[0], &go, 1) == 0;  // end of file: the parent let go
      // NOTE: _exit, not exit: the child must not run the parent's atexit or Catch's teardown.
      ::_exit(started ? body(child) : 90);
    }
    REQUIRE(pid > 0);
    children.push_back(pid);
  }
  ::close(start[0]);
  ::close(start[1]);
  std::vector<int> statuses;
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    statuses.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  return statuses;
}

TEST_CASE("processes storing and loading the same keys at once see only whole entries", "[cache]") {
  constexpr int kChildren = 12;
  constexpr int kRounds = 40;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const std::vector<Entry> entries = {sample_entry(40, 1), sample_entry(41, 1023),
                                      sample_entry(42, 64 * 1024 + 3), sample_entry(43, 17)};

  const std::vector<int> statuses = run_children(kChildren, [&](int child) {
    try {
      DiskCache cache(DiskCacheConfig{root});
      if (!cache.writable()) return 10;
      for (int round = 0; round < kRounds; ++round) {
        const Entry& entry = entries[static_cast<std::size_t>(round + child) % entries.size()];
        const std::optional<Entry> before = cache.load(entry.key, entry.meta.spec);
        if (before && !test::same_entry(*before, entry)) return 11;
        cache.store(entry);
        const std::optional<Entry> after = cache.load(entry.key, entry.meta.spec);
        if (!after) return 12;
        if (!test::same_entry(*after, entry)) return 13;
      }
      return 0;
    } catch (...) {
      return 14;
    }
  });
  CHECK(statuses == std::vector<int>(kChildren, 0));

  DiskCache cache(DiskCacheConfig{root});
  const std::vector<EntryStatus> listed = cache.list(true);
  CHECK(listed.size() == entries.size());
  std::set<std::string> keys;
  for (const EntryStatus& status : listed) {
    CAPTURE(status.path, status.problem);
    CHECK(status.valid);
    if (status.key) keys.insert(status.key->hex());
  }
  CHECK(keys.size() == entries.size());
  for (const Entry& entry : entries) {
    const std::optional<Entry> loaded = cache.load(entry.key, entry.meta.spec);
    REQUIRE(loaded);
    CHECK(test::same_entry(*loaded, entry));
  }
  CHECK(files_under(root, ".tmp").empty());
  CHECK(files_under(root).size() == entries.size());
}

TEST_CASE("threads storing and loading one key at once see only whole entries", "[cache]") {
  constexpr int kThreads = 16;
  constexpr int kRounds = 25;
  TempDir dir;
  DiskCache cache(DiskCacheConfig{dir.path()});
  const Entry entry = sample_entry(44, 4099);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        cache.store(entry);
        const std::optional<Entry> loaded = cache.load(entry.key, entry.meta.spec);
        if (!loaded || !test::same_entry(*loaded, entry)) ++bad;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(bad == 0);
  const std::vector<EntryStatus> listed = cache.list(true);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].valid);
  CHECK(files_under(dir.path()) == std::vector<fs::path>{test::entry_path(dir.path(), entry.key)});
}

TEST_CASE("lock() makes a second process wait until the first lets go", "[cache]") {
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const fs::path acquired = dir.path() / "acquired";
  const Key key = sample_entry(45).key;
  DiskCache cache(DiskCacheConfig{root});
  int go[2];
  REQUIRE(::pipe(go) == 0);
  // The child is forked before the parent locks, so it inherits no descriptor of that lock.
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(go[1]);
    char byte;
    if (::read(go[0], &byte, 1) != 1) ::_exit(20);
    const DiskCache::Lock lock = DiskCache(DiskCacheConfig{root}).lock(key);
    ::_exit(::open(acquired.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600) >= 0 ? 0 : 21);
  }
  REQUIRE(pid > 0);
  ::close(go[0]);
  std::optional<DiskCache::Lock> held = cache.lock(key);
  CHECK(fs::exists(test::entry_path(root, key).parent_path() / (key.hex() + ".lock")));
  REQUIRE(::write(go[1], "x", 1) == 1);
  ::close(go[1]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(fs::exists(acquired));  // the child is waiting for the lock
  held.reset();
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(fs::exists(acquired));
}

TEST_CASE("lock() gives up after lock_wait on a lock held by a stopped process", "[cache]") {
  using std::chrono::milliseconds;
  using std::chrono::steady_clock;
  constexpr milliseconds kWait{300};
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  const fs::path err = dir.path() / "stderr.txt";
  const Key key = sample_entry(46).key;
  DiskCache cache(DiskCacheConfig{root});
  int locked[2];
  REQUIRE(::pipe(locked) == 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    ::close(locked[0]);
    const DiskCache::Lock lock = DiskCache(DiskCacheConfig{root}).lock(key);
    if (::write(locked[1], "x", 1) != 1) ::_exit(20);
    ::raise(SIGSTOP);  // as a debugger or a hung file system would stop it
    ::_exit(0);
  }
  REQUIRE(holder > 0);
  ::close(locked[1]);
  char byte;
  REQUIRE(::read(locked[0], &byte, 1) == 1);
  ::close(locked[0]);

  // The waiter runs in a child too, so that waiting for ever (the bug) fails the test, not hangs.
  const auto start = steady_clock::now();
  const pid_t waiter = ::fork();
  if (waiter == 0) {
    const int file = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (file < 0 || ::dup2(file, 2) < 0) ::_exit(21);
    DiskCacheConfig config{root};
    config.lock_wait = kWait;
    const DiskCache::Lock lock = DiskCache(config).lock(key);
    ::_exit(0);
  }
  REQUIRE(waiter > 0);
  int status = -1;
  while (::waitpid(waiter, &status, WNOHANG) == 0 &&
         steady_clock::now() - start < milliseconds(10000)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  const auto waited = steady_clock::now() - start;
  ::kill(waiter, SIGKILL);
  ::kill(holder, SIGKILL);
  ::waitpid(waiter, nullptr, 0);
  ::waitpid(holder, nullptr, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(waited >= kWait);
  CHECK(waited < milliseconds(5000));
  const std::string warning = test::read_file(err);
  CHECK(contains(warning,
                 (test::entry_path(root, key).parent_path() / (key.hex() + ".lock")).string()));
  CHECK(contains(warning, "compiling it here too"));
}

TEST_CASE("stores skip eviction while its lock is held by a stopped process, and warn once",
          "[cache]") {
  using std::chrono::milliseconds;
  using std::chrono::steady_clock;
  TempDir dir;
  const fs::path root = dir.path() / "cache";
  DiskCacheConfig config{root};
  config.max_bytes = 1;  // every store is over the cap
  DiskCache cache(config);
  REQUIRE(cache.writable());
  // Held as by a process stopped while it evicts: a flock belongs to the open file, and this one
  // is not the cache's.
  const fs::path lock =
      test::entry_path(root, sample_entry(70).key).parent_path().parent_path() / "evict.lock";
  const int held = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);

  test::CapturedStderr captured;
  // The first store waits a moment, as for a store that is running; the next ones do not wait.
  auto start = steady_clock::now();
  cache.store(sample_entry(70));
  CHECK(steady_clock::now() - start < milliseconds(2500));
  start = steady_clock::now();
  for (int seed = 71; seed < 74; ++seed) cache.store(sample_entry(seed));
  CHECK(steady_clock::now() - start < milliseconds(500));
  const std::string text = captured.text();
  INFO(text);
  CHECK(test::count_of(text, "kiln warn:") == 1);
  CHECK(contains(text, lock.string()));
  CHECK(files_under(root, ".kbin").size() == 4);  // stored, none evicted

  ::close(held);
  cache.store(sample_entry(74));
  CHECK(files_under(root, ".kbin").size() == 1);  // the next store evicts again
}

}  // namespace
}  // namespace kiln::detail
