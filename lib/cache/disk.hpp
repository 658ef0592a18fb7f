// SPDX-License-Identifier: Apache-2.0
// The disk cache: one writable tier and any number of read-only tiers of verified entries.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/key.hpp"

namespace kiln::detail {

// The layout of entry files (lib/cache/entry_file.hpp). It is part of every key and names the
// tier's top folder (<root>/v<version>), so bumping it leaves old entries behind, never misread.
inline constexpr std::uint32_t kCacheFormatVersion = 1;

// Everything kept beside the binary. Stored as JSON inside the entry.
struct EntryMeta {
  std::string spec;  // canonical
  std::string target;
  std::string compiler;
  std::string lowered_name;
  double compile_ms = 0;
  int registers = -1;
  int spill_bytes = -1;
  int shared_bytes = -1;
  int stack_bytes = -1;
  std::string log;
};

struct Entry {
  Key key;
  EntryMeta meta;
  std::vector<std::byte> binary;
};

struct EntryStatus {
  std::filesystem::path path;
  std::optional<Key> key;         // from the file name
  std::uint64_t size = 0;         // bytes on disk
  std::int64_t last_used = 0;     // seconds since the epoch
  bool valid = false;             // header, checksum, key echo and metadata all agree
  std::string problem;            // why not, when not valid
  std::optional<EntryMeta> meta;  // when valid
};

// The most a note (DiskCache::read_note) may hold.
inline constexpr std::size_t kMaxNoteBytes = std::size_t{1} << 20;

// How long lock() waits for another process's compile of the same key before compiling too.
inline constexpr std::chrono::milliseconds kLockWait{5000};

struct DiskCacheConfig {
  std::optional<std::filesystem::path> root;  // writable tier; nullopt: memory-only
  std::vector<std::filesystem::path> ro_roots;
  std::uint64_t max_bytes = 0;  // 0: no cap
  // Reads the read-only tiers whatever their directories' owners and modes
  // (KILN_CACHE_RO_TRUST); otherwise they are held to the rules of cache/trust.hpp.
  bool trust_ro_roots = false;
  std::chrono::milliseconds lock_wait = kLockWait;
  // Whether opening creates the writable tier's root where it is missing, and proves it writable
  // by writing in it. False for `kiln cache` and `kiln info`, which inspect and must create
  // nothing: a missing root is then unusable without a warning (root_missing() says so, for the
  // caller to report), and writability is the permission check alone.
  bool create_root = true;
};

// Files in the writable tier that hold no entry: temp files of publishers at work, or killed
// before their rename, and per-key lock files.
struct Leftovers {
  std::size_t temps = 0;
  std::uint64_t temp_bytes = 0;
  std::size_t locks = 0;
};

class DiskCache {
 public:
  explicit DiskCache(DiskCacheConfig config);
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  // A verified entry for `key`, compiled from the canonical `spec`, from the writable tier, then
  // the read-only tiers in order. Anything unreadable, truncated, of another format version, or
  // whose key echo or recorded spec differs is a miss (with one warning per path), as is an
  // entry file, or everything below a directory, that breaks the rules of cache/trust.hpp. A hit
  // in the writable tier refreshes its last-used stamp.
  std::optional<Entry> load(const Key& key, std::string_view spec);

  // Publishes atomically (unique temp file in the same directory, fsync, rename), replacing any
  // entry with that key, then evicts least recently used entries over max_bytes. Failures to
  // write are warnings: the cache is an optimisation, never a reason to fail a call.
  void store(const Entry& entry);

  // Drops the writable tier's entry for `key` (after its binary failed to load, say).
  void remove(const Key& key);

  // Held while compiling `key`, so that other processes wait instead of compiling it again.
  // Purely an optimisation: correctness rests on the atomic rename. So a process that holds it
  // and is stopped (SIGSTOP, a debugger, a hung file system) delays the others by at most
  // `lock_wait`, after which they get an empty Lock and a warning, and compile as well.
  class Lock {
   public:
    Lock() = default;
    explicit Lock(int fd) : fd_(fd) {}
    Lock(Lock&& other) noexcept;
    Lock& operator=(Lock&& other) noexcept;
    ~Lock();

   private:
    int fd_ = -1;
  };
  Lock lock(const Key& key);  // an empty Lock when memory-only or the lock cannot be taken

  // Notes: small named files beside the writable tier's entries, at <root>/v<format>/<name>, for
  // facts that are slow to find again (lib/backend/lazy_compiler.hpp). `name` is plain components
  // (letters, digits, '.', '_', '-') joined by '/', such as "compilers/cuda.json". Read-only
  // tiers are never consulted. A note that is absent, unreadable, over 1 MiB or behind a link
  // reads as nullopt, as does every note when memory-only, and, after one warning, one that
  // breaks the rules of cache/trust.hpp. A write publishes atomically, as store
  // does; its failure is at most one warning.
  std::optional<std::string> read_note(std::string_view name) const;
  void write_note(std::string_view name, std::string_view text);
  // Appends `line` to a note, created where missing, in one write: lines that processes append
  // at once never interleave on a local file system, and no lock is taken, so it never waits.
  // Best-effort: a note that would grow past what read_note reads is left as it is, and any
  // failure is at most one warning.
  void append_note(std::string_view name, std::string_view line);

  bool writable() const;  // false: memory-only (the root was unusable, or none was given)
  // Why the root was refused although usable: a directory from which another user could have
  // planted a binary (cache/trust.hpp), named, with the fix. Empty otherwise.
  const std::string& untrusted() const;
  // True when the root does not exist and the config said not to create it.
  bool root_missing() const;
  const std::optional<std::filesystem::path>& root() const;
  const std::vector<std::filesystem::path>& ro_roots() const;

  // Maintenance, for `kiln cache`: the writable tier only. None of it creates a file or a
  // directory, so it works on a full disk.
  //
  // Every entry, and every directory below v<format> that kiln cannot use (a shard directory
  // that is a link, say), as an invalid status whose problem says how to fix it. Entries removed
  // while the listing runs are left out.
  std::vector<EntryStatus> list(bool verify) const;
  std::uint64_t size_bytes() const;  // entries and temp files
  Leftovers leftovers() const;
  // Removes stale leftovers (temp files an hour old, lock files no process holds), then evicts
  // LRU entries until entries and temp files total at most max_bytes; returns the entries
  // evicted. A store over max_bytes does the same.
  std::size_t prune(std::uint64_t max_bytes);
  // Removes what list(true) calls invalid (links, not their targets); returns the count.
  std::size_t remove_invalid();
  // Removes every entry, temp file and lock file, and every link or file where a shard
  // directory belongs; returns the entries removed.
  std::size_t clear();
  // The writable tier's directories (or links to them) of other cache formats (<root>/v<N>,
  // names only): another kiln version's entries and notes, which this one never reads. Nothing
  // removes them but remove_other_formats (`kiln cache clear`), which follows no link and
  // returns how many went.
  std::vector<std::string> other_formats() const;
  std::size_t remove_other_formats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::detail
