// SPDX-License-Identifier: Apache-2.0
// The disk cache's tiers: where entries live, atomic publishing, checks on load, LRU eviction.
#include "cache/disk.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>

#include "cache/entry_file.hpp"
#include "cache/file_io.hpp"
#include "cache/trust.hpp"
#include "core/log.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEntrySuffix = ".kbin";
constexpr std::string_view kLockSuffix = ".lock";
// The writable tier's eviction lock, at <root>/v<format>/ (lock_eviction).
constexpr std::string_view kEvictLock = "evict.lock";
// NOTE: directories are private so that no other user can plant a binary that kiln would load;
// files are world-readable so that a copy of the cache works as a shared read-only bundle.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0644;
// A temp file this old belongs to a publisher that died before its rename: publishing takes
// milliseconds. Pids cannot tell, as they are per host and per namespace.
constexpr std::chrono::hours kStaleTempAge{1};
// The way out of a read-only tier's trust rules, for warnings that end with a fix.
constexpr std::string_view kRoTrustHint =
    "or, to trust every read-only tier whatever its owners and modes, set KILN_CACHE_RO_TRUST=1";
// How often lock() tries again for a key's lock that another process holds.
constexpr std::chrono::milliseconds kLockRetry{10};
// How long a store waits for the eviction lock before it skips evicting: a store that is running
// holds it for milliseconds, and one stopped while it holds it must not stall every other store.
constexpr std::chrono::milliseconds kEvictionWait{1000};
std::string version_dir() {
  return fmt::format("v{}", kCacheFormatVersion);
}
std::string shard_dir(const Key& key) {
  return key.hex().substr(0, 2);
}
std::string entry_file(const Key& key) {
  return key.hex() + std::string(kEntrySuffix);
}

// Whether `name` is the directory of a cache format other than this one's (v<digits>).
bool is_other_format_dir(std::string_view name) {
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  return name.size() >= 2 && name[0] == 'v' && name != version_dir() &&
         std::all_of(name.begin() + 1, name.end(), is_digit);
}

bool is_shard_dir(std::string_view name) {
  const auto is_hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); };
  return name.size() == 2 && is_hex(name[0]) && is_hex(name[1]);
}

// Read failures that say nothing about the entry: it is absent, or the file system is busy or
// refusing this process for now.
bool is_plain_miss(int error) {
  return error == ENOENT || error == ESTALE || error == EBUSY || error == EACCES;
}

// A tier as the functions below reach it: its open root directory, its path for messages, and
// whether its directories are held to the rules of cache/trust.hpp (all but read-only tiers
// trusted with KILN_CACHE_RO_TRUST).
struct Tier {
  int fd;
  const fs::path& path;
  bool checked;
};

// A directory of a tier, reached from its root one component at a time without following links
// and checked at each: `fd`, or the errno of the call that failed, or why the directory may not
// be trusted. `path` names the last directory reached or tried.
struct TierDir {
  Fd fd;
  fs::path path;
  std::string untrusted;
};

// The directory <root>/<parts...>, each component created (0700) where missing when `create`.
TierDir open_tier_dir(const Tier& tier, std::span<const std::string> parts, bool create) {
  TierDir dir{Fd(), tier.path, {}};
  for (const std::string& part : parts) {
    dir.path /= part;
    const int at = dir.fd.ok() ? dir.fd.get() : tier.fd;  // the root's first
    Fd next = create ? make_subdir(at, part, kDirMode) : open_subdir(at, part);
    if (next.ok() && tier.checked)
      dir.untrusted = untrusted_open(next.get(), dir.path, TrustPlace::tier);
    if (!dir.untrusted.empty()) next = Fd();
    dir.fd = std::move(next);
    if (!dir.fd.ok()) break;
  }
  return dir;
}

// `key`'s shard directory in a tier.
TierDir open_shard(const Tier& tier, const Key& key, bool create) {
  const std::string parts[] = {version_dir(), shard_dir(key)};
  return open_tier_dir(tier, parts, create);
}

// What reading an entry may change: a load from the writable tier stamps a hit and removes a bad
// file; read-only tiers and listings change nothing.
enum class Upkeep { none, stamp_and_clean };

// Removes `name` from `dir` unless it is no longer the file `seen` (another process may have
// published a good entry there since it was opened). Returns whether it did.
bool remove_if_same(int dir, const std::string& name, const struct stat& seen) {
  struct stat now {};
  if (::fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return false;
  return now.st_dev == seen.st_dev && now.st_ino == seen.st_ino &&
         ::unlinkat(dir, name.c_str(), 0) == 0;
}

// Why the open file `file` at `path` in a tier must not be read (cache/trust.hpp), or empty:
// whoever else could write it could rewrite the binary, and the checksum is no seal.
std::string untrusted_open_file(const Tier& tier, int file, const fs::path& path) {
  return tier.checked ? untrusted_open(file, path, TrustPlace::file) : std::string();
}

// `key`'s entry from the file `name` in the tier's open shard directory `shard`, never through a
// link, nor from a file that breaks the rules of cache/trust.hpp; with `spec`, only if compiled
// from that spec.
EntryRead read_entry_at(const Tier& tier, const TierDir& shard, const std::string& name,
                        const Key& key, std::optional<std::string_view> spec, Upkeep upkeep) {
  // NOTE: O_NONBLOCK so that a FIFO planted under an entry's name cannot block the open.
  const Fd file(
      ::openat(shard.fd.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!file.ok() && file.error() == ELOOP) {
    struct stat link {};
    if (upkeep == Upkeep::stamp_and_clean &&
        ::fstatat(shard.fd.get(), name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISLNK(link.st_mode)) {
      ::unlinkat(shard.fd.get(), name.c_str(), 0);  // the link itself, never its target
    }
    return EntryRead{std::nullopt, 0, describe(ELOOP), {}};
  }
  if (!file.ok()) return EntryRead{std::nullopt, file.error(), {}, {}};
  // NOTE: an untrusted file is left in place: a store renames the rebuilt entry over it.
  if (std::string why = untrusted_open_file(tier, file.get(), shard.path / name); !why.empty()) {
    return EntryRead{std::nullopt, 0, {}, std::move(why)};
  }
  EntryRead read = read_entry(file.get(), key, spec);
  if (upkeep == Upkeep::none) return read;
  if (read.entry) {
    // The last-used stamp that eviction sorts by; if it fails the entry merely looks older.
    ::futimens(file.get(), nullptr);
  } else if (!read.problem.empty()) {
    struct stat seen {};
    if (::fstat(file.get(), &seen) == 0) remove_if_same(shard.fd.get(), name, seen);
  }
  return read;
}

// Warns once that nothing is read below a directory of a tier that could not be opened or
// trusted; a plain miss says nothing.
void warn_unusable_dir(const TierDir& dir) {
  if (!dir.untrusted.empty()) {
    warn_once(dir.path.string(), fmt::format("will not load kernels from below {}: {}",
                                             dir.path.string(), dir.untrusted));
  } else if (!is_plain_miss(dir.fd.error())) {
    warn_once(dir.path.string(),
              fmt::format("cache directory {} cannot be used ({}); entries under it are ignored; "
                          "check it or remove it",
                          dir.path.string(), describe(dir.fd.error())));
  }
}

std::optional<Entry> load_from(const Tier& tier, const Key& key, std::string_view spec,
                               bool writable) {
  const TierDir shard = open_shard(tier, key, /*create=*/false);
  if (!shard.fd.ok()) {
    warn_unusable_dir(shard);
    return std::nullopt;
  }
  const std::string name = entry_file(key);
  EntryRead read = read_entry_at(tier, shard, name, key, spec,
                                 writable ? Upkeep::stamp_and_clean : Upkeep::none);
  if (read.entry || is_plain_miss(read.error)) return std::move(read.entry);

  const std::string path = (shard.path / name).string();
  if (!read.untrusted.empty()) {
    warn_once(path,
              fmt::format("will not load the cache entry {}: {}; {}", path, read.untrusted,
                          writable ? "the kernel will be compiled and stored again in its place"
                                   : kRoTrustHint));
  } else if (read.error != 0) {
    warn_once(path, fmt::format("cannot read cache entry {} ({}); treating it as a miss; check the "
                                "disk or remove the file",
                                path, describe(read.error)));
  } else if (writable) {
    warn_once(path, fmt::format("removed the unusable cache entry {}: {}; the kernel will be "
                                "compiled and stored again",
                                path, read.problem));
  } else {
    warn_once(path, fmt::format("skipped the unusable read-only cache entry {}: {}; rebuild that "
                                "cache or drop it from KILN_CACHE_RO_DIRS",
                                path, read.problem));
  }
  return std::nullopt;
}

// Why a tier, open at `tier.fd`, is not to be read: a directory above it or it breaks the rules
// of cache/trust.hpp. Empty when it may be read; its own directories are checked as they are
// opened.
std::string untrusted_root(const Tier& tier) {
  if (!tier.checked) return {};
  std::string why = untrusted_above(tier.path);
  if (why.empty()) why = untrusted_open(tier.fd, tier.path, TrustPlace::tier);
  return why;
}

void warn_store_failed(const fs::path& root, const fs::path& path, int error) {
  std::string fix;
  if (error == ENOSPC || error == EDQUOT) {
    fix = fmt::format("free space in {}", root.string());
  } else if (error == ELOOP || error == ENOTDIR) {
    fix = fmt::format("remove {}", path.string());
  } else {
    fix = fmt::format("make {} writable", root.string());
  }
  warn_once("cache-store:" + root.string(),
            fmt::format("cannot store a kernel in the cache at {} ({}); kernels still run but are "
                        "compiled again in each process; {} or set KILN_CACHE_DIR to a writable "
                        "directory",
                        path.string(), describe(error), fix));
}

// Creates `path` and its missing parents with mode 0700, like `mkdir -p -m 0700`. Returns an
// errno, with `failed` naming the directory that could not be made.
int make_dirs(const fs::path& path, fs::path& failed) {
  fs::path prefix;
  for (const fs::path& part : path) {
    prefix /= part;
    if (::mkdir(prefix.c_str(), kDirMode) != 0 && errno != EEXIST) {
      failed = prefix;
      return errno;
    }
  }
  return 0;
}

// Whether a failure to create says the file system is full rather than closed to this process.
bool is_full(int error) {
  return error == ENOSPC || error == EDQUOT;
}

// Proves that entries can be published in the tier by creating and removing a temp file. A full
// disk passes: stores warn until there is room, and reading entries and the maintenance that
// frees room (`kiln cache prune`, `clear`) need none.
int probe_writable(int root, const fs::path& root_path, fs::path& failed) {
  failed = root_path / version_dir();
  const Fd version = make_subdir(root, version_dir(), kDirMode);
  if (!version.ok()) return is_full(version.error()) ? 0 : version.error();
  const TempFile probe = create_temp(version.get(), "probe", kFileMode);
  if (!probe.fd.ok()) return is_full(probe.fd.error()) ? 0 : probe.fd.error();
  ::unlinkat(version.get(), probe.name.c_str(), 0);
  return 0;
}

// Why the writable tier open at `tier.fd` must not be used although its root may: its
// v<format>, or a directory in that (shards, notes), breaks the rules of cache/trust.hpp.
// Deeper directories are checked as they are opened.
std::string untrusted_below_root(const Tier& tier) {
  const std::string version_name = version_dir();
  const TierDir version = open_tier_dir(tier, {&version_name, 1}, /*create=*/false);
  if (!version.fd.ok()) return version.untrusted;
  for (const std::string& name : dir_names(version.fd.get())) {
    struct stat info {};
    if (::fstatat(version.fd.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 ||
        !S_ISDIR(info.st_mode)) {
      continue;
    }
    std::string why = untrusted_path(version.path / name, info, ::geteuid(), TrustPlace::tier);
    if (!why.empty()) return why;
  }
  return {};
}

// The writable tier as opened once (the root itself may be a symbolic link: the user chose it).
struct WritableRoot {
  Fd fd;                  // not ok(): memory-only
  std::string untrusted;  // why, when the root could be used but must not be
  bool missing = false;   // it does not exist, and was not to be created
};

// Whether this process may write in the open directory `dir`: the probe of a tier that must
// not be written to just to look at it (DiskCacheConfig::create_root). A full disk passes.
int check_writable(int dir) {
  return ::faccessat(dir, ".", W_OK, AT_EACCESS) == 0 ? 0 : errno;
}

// Opens the writable tier, creating it where missing when `create`; memory-only, after one
// warning, when it cannot be created or written, or must not be trusted.
WritableRoot open_writable_root(const fs::path& root, bool create) {
  WritableRoot opened;
  fs::path failed = root;
  int error = create ? make_dirs(root, failed) : 0;
  if (error == 0) {
    opened.fd = Fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    error = opened.fd.error();
  }
  if (!create && error == ENOENT) {
    // NOTE: no warning: the caller asked only to look, and says what is missing.
    opened.missing = true;
    return opened;
  }
  const Tier tier{opened.fd.get(), root, /*checked=*/true};
  // NOTE: the root is checked before the probe writes in it.
  if (error == 0) opened.untrusted = untrusted_root(tier);
  if (error == 0 && opened.untrusted.empty()) {
    error = create ? probe_writable(tier.fd, root, failed) : check_writable(tier.fd);
  }
  if (error == 0 && opened.untrusted.empty()) opened.untrusted = untrusted_below_root(tier);
  if (error == 0 && opened.untrusted.empty()) return opened;
  opened.fd = Fd();
  if (!opened.untrusted.empty()) {
    warn_once("cache-root:" + root.string(),
              fmt::format("will not use {} as the kernel cache: {}; until then compiled kernels "
                          "are kept in memory only and compiled again in each process (or set "
                          "KILN_CACHE_DIR to a directory of your own)",
                          root.string(), opened.untrusted));
  } else {
    warn_once("cache-root:" + root.string(),
              fmt::format("cannot use {} as the kernel cache ({}: {}); compiled kernels are kept "
                          "in memory only and compiled again in each process; set "
                          "KILN_CACHE_DIR to a writable directory",
                          root.string(), failed.string(), describe(error)));
  }
  return opened;
}

// One file found below a tier's v<format> directory, with its lstat.
struct TierFile {
  std::string dir;  // its directory below v<format>, components joined by '/'; empty: v<format>
  std::string name;
  struct stat info {};
};

// Something below v<format> where kiln needs a directory it can use and has none: a link or a
// file named like a shard, or a directory that cannot be opened or must not be trusted.
struct BadDir {
  std::string dir;  // as TierFile::dir
  std::string name;
  std::string problem;  // what is wrong, and the fix
};

struct TierContents {
  std::vector<TierFile> files;
  std::vector<BadDir> bad_dirs;
};

bool in_shard(const TierFile& file) {
  return is_shard_dir(file.dir);
}
bool is_entry(const TierFile& file) {
  return in_shard(file) && file.name.ends_with(kEntrySuffix);
}
bool is_temp(const TierFile& file) {
  return file.name.ends_with(kTempSuffix);
}
bool is_lock(const TierFile& file) {
  return in_shard(file) && file.name.ends_with(kLockSuffix);
}
// What a file adds to the tier's size as eviction counts it.
std::uint64_t counted_bytes(const TierFile& file) {
  return is_entry(file) || is_temp(file) ? static_cast<std::uint64_t>(file.info.st_size) : 0;
}

std::vector<std::string> split_dir(const std::string& dir) {
  std::vector<std::string> parts{version_dir()};
  for (std::size_t start = 0; start < dir.size();) {
    const std::size_t slash = std::min(dir.find('/', start), dir.size());
    parts.push_back(dir.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

// The directory `dir` (as TierFile::dir) of a tier.
TierDir open_contents_dir(const Tier& tier, const std::string& dir) {
  return open_tier_dir(tier, split_dir(dir), /*create=*/false);
}

// Adds what is in the open directory `fd`, which is `dir` (as TierFile::dir), and below it.
void collect(const Tier& tier, int fd, const std::string& dir, TierContents& contents) {
  for (std::string& name : dir_names(fd)) {
    struct stat info {};
    if (::fstatat(fd, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone since
    const bool shard_name = dir.empty() && is_shard_dir(name);
    if (!S_ISDIR(info.st_mode)) {
      if (!shard_name) {
        contents.files.push_back({dir, std::move(name), info});
      } else if (S_ISLNK(info.st_mode)) {
        contents.bad_dirs.push_back({dir, std::move(name), describe(ELOOP) + ": remove the link"});
      } else {
        contents.bad_dirs.push_back({dir, std::move(name), "it is not a directory: remove it"});
      }
      continue;
    }
    const std::string path = dir.empty() ? name : dir + "/" + name;
    const TierDir sub = open_contents_dir(tier, path);
    if (sub.fd.ok()) {
      collect(tier, sub.fd.get(), path, contents);
    } else if (!sub.untrusted.empty()) {
      contents.bad_dirs.push_back({dir, std::move(name), sub.untrusted});
    } else if (sub.fd.error() != ENOENT) {
      contents.bad_dirs.push_back({dir, std::move(name), describe(sub.fd.error())});
    }
  }
}

// Every file below the tier's v<format> directory, links included but not followed, and every
// place where a directory is needed and none can be used.
TierContents tier_contents(const Tier& tier) {
  TierContents contents;
  const TierDir version = open_contents_dir(tier, "");
  if (version.fd.ok()) collect(tier, version.fd.get(), "", contents);
  return contents;
}

fs::path path_of(const Tier& tier, const std::string& dir, const std::string& name) {
  fs::path path = tier.path / version_dir();
  if (!dir.empty()) path /= dir;
  return path / name;
}

// Removes `name` of `dir`, a directory with everything under it, following no link (a link is
// removed, not what it points to); returns whether it is gone.
bool remove_tree(int dir, const std::string& name) {
  struct stat info {};
  if (::fstatat(dir, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT;
  if (!S_ISDIR(info.st_mode)) return ::unlinkat(dir, name.c_str(), 0) == 0;
  if (const Fd tree = open_subdir(dir, name); tree.ok()) {
    for (const std::string& child : dir_names(tree.get())) remove_tree(tree.get(), child);
  }
  return ::unlinkat(dir, name.c_str(), AT_REMOVEDIR) == 0;
}

// Removes the file or link `name` in the tier's directory `dir`, never a directory (unlinkat
// without AT_REMOVEDIR refuses one); returns an errno.
int remove_file(const Tier& tier, const std::string& dir, const std::string& name) {
  const TierDir at = open_contents_dir(tier, dir);
  if (!at.fd.ok()) return at.fd.error();
  return ::unlinkat(at.fd.get(), name.c_str(), 0) == 0 ? 0 : errno;
}

// Removes the lock file `file` unless a process holds it; returns whether it did.
bool remove_unheld_lock(const Tier& tier, const TierFile& file) {
  const TierDir at = open_contents_dir(tier, file.dir);
  if (!at.fd.ok()) return false;
  const Fd lock(
      ::openat(at.fd.get(), file.name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat seen {};
  return lock.ok() && ::flock(lock.get(), LOCK_EX | LOCK_NB) == 0 &&
         ::fstat(lock.get(), &seen) == 0 && remove_if_same(at.fd.get(), file.name, seen);
}

bool is_stale_temp(const TierFile& file, std::chrono::system_clock::time_point now) {
  const auto modified =
      std::chrono::system_clock::time_point(std::chrono::seconds(file.info.st_mtim.tv_sec) +
                                            std::chrono::nanoseconds(file.info.st_mtim.tv_nsec));
  return is_temp(file) && now - modified > kStaleTempAge;
}

// Removes what publishers killed before their rename left behind (temp files older than
// kStaleTempAge) and lock files no process holds, and drops them from `files`.
void remove_stale_leftovers(const Tier& tier, std::vector<TierFile>& files) {
  const auto now = std::chrono::system_clock::now();
  std::erase_if(files, [&](const TierFile& file) {
    if (is_stale_temp(file, now)) return remove_file(tier, file.dir, file.name) == 0;
    return is_lock(file) && remove_unheld_lock(tier, file);
  });
}

// The status of the entry file `file`, or nullopt when it is gone; with `verify`, whether it
// holds a valid entry for the key its name gives.
std::optional<EntryStatus> entry_status(const Tier& tier, const TierFile& file, bool verify) {
  EntryStatus status;
  status.path = path_of(tier, file.dir, file.name);
  status.key =
      Key::from_hex(std::string_view(file.name).substr(0, file.name.size() - kEntrySuffix.size()));
  status.size = static_cast<std::uint64_t>(file.info.st_size);
  status.last_used = file.info.st_mtim.tv_sec;
  if (!verify) return status;
  if (!status.key) {
    status.problem = "its name is not <32 lowercase hex digits>.kbin";
    return status;
  }
  if (shard_dir(*status.key) != file.dir) {
    status.problem = fmt::format("it is not in its key's directory {}", shard_dir(*status.key));
    return status;
  }
  const TierDir shard = open_contents_dir(tier, file.dir);
  if (!shard.untrusted.empty()) {
    status.problem = shard.untrusted;
    return status;
  }
  EntryRead read =
      shard.fd.ok() ? read_entry_at(tier, shard, file.name, *status.key, std::nullopt, Upkeep::none)
                    : EntryRead{std::nullopt, shard.fd.error(), {}, {}};
  // NOTE: eviction or `clear` in another process may remove an entry between the listing and
  // this read: gone is not bad.
  if (read.error == ENOENT) return std::nullopt;
  status.valid = read.entry.has_value();
  if (read.entry) status.meta = std::move(read.entry->meta);
  if (read.error != 0) status.problem = describe(read.error);
  if (!read.problem.empty()) status.problem = std::move(read.problem);
  if (!read.untrusted.empty()) status.problem = std::move(read.untrusted);
  return status;
}

EntryStatus bad_dir_status(const Tier& tier, const BadDir& bad) {
  EntryStatus status;
  status.path = path_of(tier, bad.dir, bad.name);
  status.problem = bad.problem;
  return status;
}

// Removes the least recently used entries until the tier's entries and temp files total at most
// `max_bytes`, sparing `keep` (the entry just stored, however large), after its stale leftovers.
// Returns how many entries it removed.
std::size_t evict(const Tier& tier, std::uint64_t max_bytes, const std::optional<Key>& keep) {
  std::vector<TierFile> files = tier_contents(tier).files;
  remove_stale_leftovers(tier, files);
  std::uint64_t total = 0;
  for (const TierFile& file : files) total += counted_bytes(file);
  std::erase_if(files, [](const TierFile& file) { return !is_entry(file); });
  std::sort(files.begin(), files.end(), [](const TierFile& a, const TierFile& b) {
    return std::tie(a.info.st_mtim.tv_sec, a.info.st_mtim.tv_nsec, a.name) <
           std::tie(b.info.st_mtim.tv_sec, b.info.st_mtim.tv_nsec, b.name);
  });
  const std::string kept = keep ? entry_file(*keep) : std::string();
  std::size_t removed = 0;
  for (const TierFile& entry : files) {
    if (total <= max_bytes) break;
    if (entry.name == kept) continue;
    const int error = remove_file(tier, entry.dir, entry.name);
    if (error == 0) ++removed;
    if (error == 0 || error == ENOENT) total -= counted_bytes(entry);
  }
  return removed;
}

// The components of a note's name. Throws kiln::Error (invalid_argument) for a name that could
// leave its directory or hide among entries' temp files.
std::vector<std::string> note_parts(std::string_view name) {
  const auto is_plain = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  };
  std::vector<std::string> parts;
  for (std::string_view rest = name;;) {
    const std::size_t slash = rest.find('/');
    const std::string_view part = rest.substr(0, slash);
    if (part.empty() || part == "." || part == ".." || part.ends_with(kTempSuffix) ||
        !std::all_of(part.begin(), part.end(), is_plain)) {
      throw Error(ErrorCategory::invalid_argument,
                  fmt::format("cache note name '{}' must be plain components joined by '/', such "
                              "as compilers/cuda.json",
                              name));
    }
    parts.emplace_back(part);
    if (slash == std::string_view::npos) return parts;
    rest.remove_prefix(slash + 1);
  }
}

// The directory of the note whose name is `parts`, created (0700) where missing when `create`.
TierDir open_note_dir(const Tier& tier, std::span<const std::string> parts, bool create) {
  std::vector<std::string> dirs{version_dir()};
  dirs.insert(dirs.end(), parts.begin(), parts.end() - 1);
  return open_tier_dir(tier, dirs, create);
}

// Takes an exclusive flock on `fd`, trying every kLockRetry until `wait` has passed (a blocking
// flock would wait for ever on a holder that is stopped). Returns whether it holds the lock.
bool flock_within(int fd, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return false;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kLockRetry);
  }
  return true;
}

// The tier's eviction lock, <root>/v<format>/evict.lock, held while the returned descriptor is
// open; when another holds it beyond `wait`, an Fd whose error is EWOULDBLOCK (or that of the call
// that failed).
Fd lock_eviction(const Tier& tier, std::chrono::milliseconds wait) {
  const std::string name(kEvictLock);
  const TierDir dir = open_note_dir(tier, std::span(&name, 1), /*create=*/true);
  if (!dir.fd.ok()) return Fd();
  Fd file(
      ::openat(dir.fd.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  if (file.ok() && !flock_within(file.get(), wait)) return Fd(-1);
  return file;
}

void warn_eviction_skipped(const fs::path& root, std::uint64_t max_bytes) {
  const fs::path lock = root / version_dir() / kEvictLock;
  warn_once(
      "cache-evict:" + root.string(),
      fmt::format("stored a kernel in the cache at {} without evicting down to "
                  "KILN_CACHE_MAX_BYTES ({} bytes): another store has held {} for over {} "
                  "ms (a process stopped while it evicts?), so stores skip eviction until "
                  "they can take it, and the cache may exceed its cap; resume or end that "
                  "process (`fuser {}` names it), or run `kiln cache prune`",
                  root.string(), max_bytes, lock.string(), kEvictionWait.count(), lock.string()));
}

// The whole of a regular file of at most `max_bytes`; nullopt otherwise or on a read error.
std::optional<std::string> read_text(int fd, std::size_t max_bytes) {
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<std::uint64_t>(info.st_size) > max_bytes) {
    return std::nullopt;
  }
  std::string text(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = ::read(fd, text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::nullopt;
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  text.resize(done);
  return text;
}

}  // namespace

struct DiskCache::Impl {
  DiskCacheConfig config;
  WritableRoot root;  // fd not ok(): memory-only
  // The last store found the eviction lock held past kEvictionWait: the next one does not wait.
  std::atomic<bool> eviction_stuck{false};

  Tier writable_tier() const { return Tier{root.fd.get(), *config.root, /*checked=*/true}; }
};

DiskCache::DiskCache(DiskCacheConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  if (impl_->config.root) {
    impl_->root = open_writable_root(*impl_->config.root, impl_->config.create_root);
  }
}

DiskCache::~DiskCache() = default;

std::optional<Entry> DiskCache::load(const Key& key, std::string_view spec) {
  if (writable()) {
    if (auto entry = load_from(impl_->writable_tier(), key, spec, /*writable=*/true)) {
      return entry;
    }
  }
  for (const fs::path& ro_root : impl_->config.ro_roots) {
    const Fd fd(::open(ro_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.ok() && !is_plain_miss(fd.error())) {
      warn_once(ro_root.string(),
                fmt::format("cannot read the read-only cache directory {} ({}); it is skipped; "
                            "fix it or drop it from KILN_CACHE_RO_DIRS",
                            ro_root.string(), describe(fd.error())));
    }
    if (!fd.ok()) continue;
    const Tier tier{fd.get(), ro_root, !impl_->config.trust_ro_roots};
    if (const std::string why = untrusted_root(tier); !why.empty()) {
      warn_once(ro_root.string(),
                fmt::format("will not load kernels from the read-only cache directory {}: {}; {}",
                            ro_root.string(), why, kRoTrustHint));
      continue;
    }
    if (auto entry = load_from(tier, key, spec, /*writable=*/false)) return entry;
  }
  return std::nullopt;
}

void DiskCache::store(const Entry& entry) {
  if (!writable()) return;
  const Tier tier = impl_->writable_tier();
  const TierDir shard = open_shard(tier, entry.key, /*create=*/true);
  if (!shard.fd.ok()) {
    if (!shard.untrusted.empty()) return warn_unusable_dir(shard);
    return warn_store_failed(tier.path, shard.path, shard.fd.error());
  }
  // With a cap, a store publishes and evicts under the tier's eviction lock: two at once could
  // otherwise each evict the other's entry, leaving neither. Eviction is best-effort: a store
  // that cannot take the lock in kEvictionWait skips it, and while the lock stays held so do the
  // next ones, without waiting.
  const bool capped = impl_->config.max_bytes > 0;
  const auto wait = impl_->eviction_stuck ? std::chrono::milliseconds(0) : kEvictionWait;
  const Fd eviction = capped ? lock_eviction(tier, wait) : Fd();
  const bool skip_eviction = capped && eviction.error() == EWOULDBLOCK;
  if (capped) impl_->eviction_stuck = skip_eviction;
  const std::string name = entry_file(entry.key);
  if (const int error = publish(shard.fd.get(), name, kFileMode,
                                [&](int fd) { return write_entry(fd, entry); })) {
    return warn_store_failed(tier.path, shard.path / name, error);
  }
  if (skip_eviction) return warn_eviction_skipped(tier.path, impl_->config.max_bytes);
  if (capped) evict(tier, impl_->config.max_bytes, entry.key);
}

void DiskCache::remove(const Key& key) {
  if (!writable()) return;
  const TierDir shard = open_shard(impl_->writable_tier(), key, /*create=*/false);
  if (shard.fd.ok()) ::unlinkat(shard.fd.get(), entry_file(key).c_str(), 0);
}

DiskCache::Lock::Lock(Lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

DiskCache::Lock& DiskCache::Lock::operator=(Lock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

DiskCache::Lock::~Lock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

DiskCache::Lock DiskCache::lock(const Key& key) {
  if (!writable()) return Lock();
  const TierDir shard = open_shard(impl_->writable_tier(), key, /*create=*/true);
  if (!shard.fd.ok()) return Lock();
  const std::string name = key.hex() + std::string(kLockSuffix);
  Fd file(
      ::openat(shard.fd.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  if (!file.ok()) return Lock();
  if (!flock_within(file.get(), impl_->config.lock_wait)) {
    if (errno != EWOULDBLOCK && errno != EINTR) return Lock();
    const fs::path path = shard.path / name;
    warn_once("cache-lock:" + path.string(),
              fmt::format("waited {} ms for {}, which another process holds while it compiles "
                          "that kernel (or was stopped holding it); compiling it here too",
                          impl_->config.lock_wait.count(), path.string()));
    return Lock();
  }
  return Lock(file.release());
}

std::optional<std::string> DiskCache::read_note(std::string_view name) const {
  const std::vector<std::string> parts = note_parts(name);
  if (!writable()) return std::nullopt;
  const Tier tier = impl_->writable_tier();
  const TierDir dir = open_note_dir(tier, parts, /*create=*/false);
  if (!dir.fd.ok()) return std::nullopt;
  // NOTE: O_NONBLOCK so that a FIFO planted under the note's name cannot block the open.
  const Fd file(
      ::openat(dir.fd.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!file.ok()) return std::nullopt;
  // A forged note could make kiln key kernels wrongly: refused like a corrupt one, and rewritten.
  const fs::path path = dir.path / parts.back();
  if (const std::string why = untrusted_open_file(tier, file.get(), path); !why.empty()) {
    warn_once(path.string(),
              fmt::format("will not read the cache note {}: {}; it will be written again",
                          path.string(), why));
    return std::nullopt;
  }
  return read_text(file.get(), kMaxNoteBytes);
}

void DiskCache::write_note(std::string_view name, std::string_view text) {
  const std::vector<std::string> parts = note_parts(name);
  if (!writable()) return;
  const TierDir dir = open_note_dir(impl_->writable_tier(), parts, /*create=*/true);
  if (!dir.untrusted.empty()) return warn_unusable_dir(dir);
  const int error = dir.fd.ok() ? publish(dir.fd.get(), parts.back(), kFileMode,
                                          [&](int fd) { return write_all(fd, text); })
                                : dir.fd.error();
  if (error == 0) return;
  const fs::path path = *impl_->config.root / version_dir() / name;
  warn_once("cache-note:" + path.string(),
            fmt::format("cannot write the cache note {} ({}); kiln works without it, only "
                        "slower to start; make {} writable or remove what is in the way",
                        path.string(), describe(error), impl_->config.root->string()));
}

void DiskCache::append_note(std::string_view name, std::string_view line) {
  const std::vector<std::string> parts = note_parts(name);
  if (!writable()) return;
  const Tier tier = impl_->writable_tier();
  const TierDir dir = open_note_dir(tier, parts, /*create=*/true);
  if (!dir.untrusted.empty()) return warn_unusable_dir(dir);
  if (!dir.fd.ok()) return;
  // NOTE: O_NONBLOCK so that a FIFO planted under the note's name cannot block the open.
  const Fd file(::openat(dir.fd.get(), parts.back().c_str(),
                         O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
                         kFileMode));
  const fs::path path = dir.path / parts.back();
  struct stat info {};
  if (!file.ok() || ::fstat(file.get(), &info) != 0 || !S_ISREG(info.st_mode) ||
      !untrusted_open_file(tier, file.get(), path).empty()) {
    return warn_once("cache-note:" + path.string(),
                     fmt::format("cannot append to the cache note {}: it cannot be opened, or is "
                                 "no regular file of yours; remove it and kiln writes it again",
                                 path.string()));
  }
  // NOTE: a failed write (a full disk) is silent: the note is a tally, never worth a warning
  // per call.
  if (static_cast<std::uint64_t>(info.st_size) + line.size() <= kMaxNoteBytes) {
    write_all(file.get(), line);
  }
}

bool DiskCache::writable() const {
  return impl_->root.fd.ok();
}

const std::string& DiskCache::untrusted() const {
  return impl_->root.untrusted;
}

bool DiskCache::root_missing() const {
  return impl_->root.missing;
}

const std::optional<std::filesystem::path>& DiskCache::root() const {
  return impl_->config.root;
}

const std::vector<std::filesystem::path>& DiskCache::ro_roots() const {
  return impl_->config.ro_roots;
}

std::vector<EntryStatus> DiskCache::list(bool verify) const {
  std::vector<EntryStatus> statuses;
  if (!writable()) return statuses;
  const Tier tier = impl_->writable_tier();
  const TierContents contents = tier_contents(tier);
  for (const TierFile& file : contents.files) {
    if (!is_entry(file)) continue;
    if (std::optional<EntryStatus> status = entry_status(tier, file, verify)) {
      statuses.push_back(std::move(*status));
    }
  }
  for (const BadDir& bad : contents.bad_dirs) statuses.push_back(bad_dir_status(tier, bad));
  std::sort(statuses.begin(), statuses.end(),
            [](const EntryStatus& a, const EntryStatus& b) { return a.path < b.path; });
  return statuses;
}

std::vector<std::string> DiskCache::other_formats() const {
  std::vector<std::string> names;
  if (!writable()) return names;
  for (std::string& name : dir_names(impl_->root.fd.get())) {
    struct stat info {};
    if (is_other_format_dir(name) &&
        ::fstatat(impl_->root.fd.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISDIR(info.st_mode) || S_ISLNK(info.st_mode))) {
      names.push_back(std::move(name));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::uint64_t DiskCache::size_bytes() const {
  std::uint64_t total = 0;
  if (!writable()) return total;
  for (const TierFile& file : tier_contents(impl_->writable_tier()).files) {
    total += counted_bytes(file);
  }
  return total;
}

Leftovers DiskCache::leftovers() const {
  Leftovers found;
  if (!writable()) return found;
  for (const TierFile& file : tier_contents(impl_->writable_tier()).files) {
    if (is_temp(file)) {
      ++found.temps;
      found.temp_bytes += counted_bytes(file);
    }
    if (is_lock(file)) ++found.locks;
  }
  return found;
}

std::size_t DiskCache::prune(std::uint64_t max_bytes) {
  return writable() ? evict(impl_->writable_tier(), max_bytes, std::nullopt) : 0;
}

std::size_t DiskCache::remove_invalid() {
  if (!writable()) return 0;
  const Tier tier = impl_->writable_tier();
  const TierContents contents = tier_contents(tier);
  std::size_t removed = 0;
  for (const TierFile& file : contents.files) {
    if (!is_entry(file)) continue;
    const std::optional<EntryStatus> status = entry_status(tier, file, /*verify=*/true);
    if (status && !status->valid && remove_file(tier, file.dir, file.name) == 0) ++removed;
  }
  for (const BadDir& bad : contents.bad_dirs) {
    if (remove_file(tier, bad.dir, bad.name) == 0) ++removed;
  }
  return removed;
}

std::size_t DiskCache::remove_other_formats() {
  std::size_t removed = 0;
  for (const std::string& name : other_formats()) {
    if (remove_tree(impl_->root.fd.get(), name)) ++removed;
  }
  return removed;
}

std::size_t DiskCache::clear() {
  if (!writable()) return 0;
  const Tier tier = impl_->writable_tier();
  const TierContents contents = tier_contents(tier);
  std::size_t removed = 0;
  for (const TierFile& file : contents.files) {
    if (!is_entry(file) && !is_temp(file) && !is_lock(file)) continue;
    if (remove_file(tier, file.dir, file.name) == 0 && is_entry(file)) ++removed;
  }
  for (const BadDir& bad : contents.bad_dirs) remove_file(tier, bad.dir, bad.name);
  // Empty shard directories go too; one still in use is not empty and stays.
  if (const TierDir version = open_contents_dir(tier, ""); version.fd.ok()) {
    for (const std::string& name : dir_names(version.fd.get())) {
      if (is_shard_dir(name)) ::unlinkat(version.fd.get(), name.c_str(), AT_REMOVEDIR);
    }
  }
  return removed;
}

}  // namespace kiln::detail
