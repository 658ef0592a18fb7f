// The disk cache's tiers: where entries live, atomic publishing, checks on load, LRU eviction.
#include "cache/disk.hpp"

#include <dirent.h>
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
#include <tuple>
#include <utility>

#include "cache/entry_file.hpp"
#include "kiln/error.hpp"
#include "log.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kEntrySuffix = ".kbin";
constexpr std::string_view kTempSuffix = ".tmp";
constexpr std::string_view kLockSuffix = ".lock";
// NOTE: directories are private so that no other user can plant a binary that kiln would load;
// files are world-readable so that a copy of the cache works as a shared read-only bundle.
constexpr mode_t kDirMode = 0700;
constexpr mode_t kFileMode = 0644;
// Temp names are unique per process already; retries only matter for a leftover of a dead
// process with the same pid, or another host sharing the directory.
constexpr int kTempAttempts = 100;

// An owned file descriptor, or the errno of the call that failed to open it.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd), error_(fd < 0 ? errno : 0) {}
  Fd(Fd&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), error_(std::exchange(other.error_, EBADF)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = std::exchange(other.fd_, -1);
      error_ = std::exchange(other.error_, EBADF);
    }
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool ok() const { return fd_ >= 0; }
  int get() const { return fd_; }
  int error() const { return error_; }
  int release() { return std::exchange(fd_, -1); }
  // Closes now and returns the errno close reported: on NFS a failed write may surface only here.
  int close() { return ::close(std::exchange(fd_, -1)) == 0 ? 0 : errno; }

 private:
  int fd_ = -1;
  int error_ = EBADF;
};

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

std::string describe(int error) {
  // NOTE: O_NOFOLLOW reports a symbolic link as ELOOP, whose usual text misleads here.
  if (error == ELOOP) return "it is a symbolic link, which kiln never follows inside its cache";
  return std::error_code(error, std::generic_category()).message();
}

// Read failures that say nothing about the entry: it is absent, or the file system is busy or
// refusing this process for now.
bool is_plain_miss(int error) {
  return error == ENOENT || error == ESTALE || error == EBUSY || error == EACCES;
}

Fd open_subdir(int dir, const std::string& name) {
  Fd subdir(::openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  // NOTE: with O_DIRECTORY, Linux reports a link as ENOTDIR; say ELOOP so that the warning can
  // say it is a link.
  struct stat info {};
  if (subdir.error() == ENOTDIR && ::fstatat(dir, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(info.st_mode)) {
    errno = ELOOP;
    return Fd(-1);
  }
  return subdir;
}

Fd make_subdir(int dir, const std::string& name) {
  if (::mkdirat(dir, name.c_str(), kDirMode) == 0) {
    ::fsync(dir);  // NOTE: so that after a crash no synced entry is left without its directory
  } else if (errno != EEXIST) {
    return Fd(-1);
  }
  return open_subdir(dir, name);
}

// `key`'s shard directory in a tier, reached one component at a time without following links,
// and created (0700) where missing when `create`. `path` receives the last component's path.
Fd open_shard(int tier, const fs::path& tier_path, const Key& key, bool create, fs::path& path) {
  const auto open = create ? make_subdir : open_subdir;
  path = tier_path / version_dir();
  Fd version = open(tier, version_dir());
  if (!version.ok()) return version;
  path /= shard_dir(key);
  return open(version.get(), shard_dir(key));
}

struct TempFile {
  std::string name;
  Fd fd;
};

// A new empty file in `dir` whose name starts with `stem` and no other thread, process or host
// is using (O_EXCL decides).
TempFile create_temp(int dir, const std::string& stem) {
  static std::atomic<std::uint64_t> sequence{0};
  for (int attempt = 1;; ++attempt) {
    std::string name = fmt::format("{}.{}.{}{}", stem, ::getpid(), sequence++, kTempSuffix);
    Fd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   kFileMode));
    if (fd.ok() || fd.error() != EEXIST || attempt == kTempAttempts) {
      return {std::move(name), std::move(fd)};
    }
  }
}

// Writes a temp file beside `name` with `write` (which returns an errno), syncs it, renames it
// over `name` and syncs the directory, so readers see the old file or the whole new one, never a
// part. Returns an errno.
template <class Write>
int publish(int dir, const std::string& name, Write&& write) {
  TempFile temp = create_temp(dir, name);
  if (!temp.fd.ok()) return temp.fd.error();
  int error = write(temp.fd.get());
  if (error == 0 && ::fsync(temp.fd.get()) != 0) error = errno;
  if (const int close_error = temp.fd.close(); error == 0) error = close_error;
  if (error == 0 && ::renameat(dir, temp.name.c_str(), dir, name.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlinkat(dir, temp.name.c_str(), 0);
    return error;
  }
  ::fsync(dir);  // NOTE: makes the rename durable; syncing the file alone does not
  return 0;
}

// What reading an entry may change: a load from the writable tier stamps a hit and removes a bad
// file; read-only tiers and listings change nothing.
enum class Upkeep { none, stamp_and_clean };

// Removes `name` from `dir` unless it is no longer the file `seen` (another process may have
// published a good entry there since it was opened).
void remove_if_same(int dir, const std::string& name, const struct stat& seen) {
  struct stat now {};
  if (::fstatat(dir, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (now.st_dev == seen.st_dev && now.st_ino == seen.st_ino) ::unlinkat(dir, name.c_str(), 0);
}

// `key`'s entry from the file `name` in the open shard directory `shard`, never through a link.
EntryRead read_entry_at(int shard, const std::string& name, const Key& key, Upkeep upkeep) {
  // NOTE: O_NONBLOCK so that a FIFO planted under an entry's name cannot block the open.
  const Fd file(::openat(shard, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!file.ok() && file.error() == ELOOP) {
    struct stat link {};
    if (upkeep == Upkeep::stamp_and_clean &&
        ::fstatat(shard, name.c_str(), &link, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(link.st_mode)) {
      ::unlinkat(shard, name.c_str(), 0);  // the link itself, never its target
    }
    return EntryRead{std::nullopt, 0, describe(ELOOP)};
  }
  if (!file.ok()) return EntryRead{std::nullopt, file.error(), {}};
  EntryRead read = read_entry(file.get(), key);
  if (upkeep == Upkeep::none) return read;
  if (read.entry) {
    // The last-used stamp that eviction sorts by; if it fails the entry merely looks older.
    ::futimens(file.get(), nullptr);
  } else if (!read.problem.empty()) {
    struct stat seen {};
    if (::fstat(file.get(), &seen) == 0) remove_if_same(shard, name, seen);
  }
  return read;
}

void warn_unreadable_dir(const fs::path& path, int error) {
  if (is_plain_miss(error)) return;
  warn_once(path.string(),
            fmt::format("cache directory {} cannot be used ({}); entries under it are ignored; "
                        "check it or remove it",
                        path.string(), describe(error)));
}

std::optional<Entry> load_from(int tier, const fs::path& tier_path, const Key& key, bool writable) {
  fs::path shard_path;
  const Fd shard = open_shard(tier, tier_path, key, /*create=*/false, shard_path);
  if (!shard.ok()) {
    warn_unreadable_dir(shard_path, shard.error());
    return std::nullopt;
  }
  const std::string name = entry_file(key);
  EntryRead read =
      read_entry_at(shard.get(), name, key, writable ? Upkeep::stamp_and_clean : Upkeep::none);
  if (read.entry || is_plain_miss(read.error)) return std::move(read.entry);

  const std::string path = (shard_path / name).string();
  if (read.error != 0) {
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

// Proves that entries can be published in the tier by creating and removing a temp file.
int probe_writable(int root, const fs::path& root_path, fs::path& failed) {
  failed = root_path / version_dir();
  const Fd version = make_subdir(root, version_dir());
  if (!version.ok()) return version.error();
  const TempFile probe = create_temp(version.get(), "probe");
  if (!probe.fd.ok()) return probe.fd.error();
  ::unlinkat(version.get(), probe.name.c_str(), 0);
  return 0;
}

// The writable tier's directory, opened once (the root itself may be a symbolic link: the user
// chose it). Not ok(), after one warning, when it cannot be created or written.
Fd open_writable_root(const fs::path& root) {
  fs::path failed = root;
  Fd dir;
  int error = make_dirs(root, failed);
  if (error == 0) {
    dir = Fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    error = dir.error();
  }
  if (error == 0) error = probe_writable(dir.get(), root, failed);
  if (error == 0) return dir;
  warn_once("cache-root:" + root.string(),
            fmt::format("cannot use {} as the kernel cache ({}: {}); compiled kernels are kept in "
                        "memory only and compiled again in each process; set KILN_CACHE_DIR to a "
                        "writable directory",
                        root.string(), failed.string(), describe(error)));
  return Fd();
}

// One file found in a tier's shard directories, with its lstat.
struct TierFile {
  std::string shard;
  std::string name;
  struct stat info {};
};

std::vector<std::string> dir_names(int dir) {
  std::vector<std::string> names;
  // NOTE: fdopendir takes ownership of its descriptor, so it gets a duplicate. The duplicate
  // shares the directory's read position, which the last listing left at the end: rewind.
  const int copy = ::fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return names;
  DIR* stream = ::fdopendir(copy);
  if (stream == nullptr) {
    ::close(copy);
    return names;
  }
  ::rewinddir(stream);
  while (const dirent* item = ::readdir(stream)) {
    const std::string_view name = item->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(stream);
  return names;
}

Fd open_shard_named(int tier, const std::string& shard) {
  Fd version = open_subdir(tier, version_dir());
  if (!version.ok()) return version;
  return open_subdir(version.get(), shard);
}

// Every file in the tier's shard directories of this format version, links included but not
// followed.
std::vector<TierFile> tier_files(int tier) {
  std::vector<TierFile> files;
  const Fd version = open_subdir(tier, version_dir());
  if (!version.ok()) return files;
  for (std::string& shard_name : dir_names(version.get())) {
    if (!is_shard_dir(shard_name)) continue;
    const Fd shard = open_subdir(version.get(), shard_name);
    if (!shard.ok()) continue;
    for (std::string& name : dir_names(shard.get())) {
      TierFile file{shard_name, std::move(name)};
      if (::fstatat(shard.get(), file.name.c_str(), &file.info, AT_SYMLINK_NOFOLLOW) == 0) {
        files.push_back(std::move(file));
      }
    }
  }
  return files;
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

std::vector<TierFile> tier_entries(int tier) {
  std::vector<TierFile> files = tier_files(tier);
  std::erase_if(files, [](const TierFile& file) { return !file.name.ends_with(kEntrySuffix); });
  return files;
}

int remove_file(int tier, const TierFile& file) {
  const Fd shard = open_shard_named(tier, file.shard);
  if (!shard.ok()) return shard.error();
  return ::unlinkat(shard.get(), file.name.c_str(), 0) == 0 ? 0 : errno;
}

// Fills in whether `file` holds a valid entry for the key its name gives.
void verify(int tier, const TierFile& file, EntryStatus& status) {
  if (!status.key) {
    status.problem = "its name is not <32 lowercase hex digits>.kbin";
    return;
  }
  if (shard_dir(*status.key) != file.shard) {
    status.problem = fmt::format("it is not in its key's directory {}", shard_dir(*status.key));
    return;
  }
  const Fd shard = open_shard_named(tier, file.shard);
  EntryRead read = shard.ok() ? read_entry_at(shard.get(), file.name, *status.key, Upkeep::none)
                              : EntryRead{std::nullopt, shard.error(), {}};
  status.valid = read.entry.has_value();
  if (read.entry) status.meta = std::move(read.entry->meta);
  if (read.error != 0) status.problem = describe(read.error);
  if (!read.problem.empty()) status.problem = std::move(read.problem);
}

// Removes the least recently used entries until the tier's entries total at most `max_bytes`,
// sparing `keep` (the entry just stored, however large). Returns how many it removed.
std::size_t evict(int tier, std::uint64_t max_bytes, const std::optional<Key>& keep) {
  std::vector<TierFile> entries = tier_entries(tier);
  std::uint64_t total = 0;
  for (const TierFile& entry : entries) total += static_cast<std::uint64_t>(entry.info.st_size);
  std::sort(entries.begin(), entries.end(), [](const TierFile& a, const TierFile& b) {
    return std::tie(a.info.st_mtim.tv_sec, a.info.st_mtim.tv_nsec, a.name) <
           std::tie(b.info.st_mtim.tv_sec, b.info.st_mtim.tv_nsec, b.name);
  });
  const std::string kept = keep ? entry_file(*keep) : std::string();
  std::size_t removed = 0;
  for (const TierFile& entry : entries) {
    if (total <= max_bytes) break;
    if (entry.name == kept) continue;
    const int error = remove_file(tier, entry);
    if (error == 0) ++removed;
    if (error == 0 || error == ENOENT) total -= static_cast<std::uint64_t>(entry.info.st_size);
  }
  return removed;
}

constexpr std::size_t kMaxNoteBytes = std::size_t{1} << 20;

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

// The directory of the note whose name is `parts`, reached from the tier one component at a time
// without following links, and created (0700) where missing when `create`.
Fd open_note_dir(int tier, std::span<const std::string> parts, bool create) {
  const auto open = create ? make_subdir : open_subdir;
  Fd dir = open(tier, version_dir());
  for (std::size_t i = 0; i + 1 < parts.size() && dir.ok(); ++i) dir = open(dir.get(), parts[i]);
  return dir;
}

int write_text(int fd, std::string_view text) {
  while (!text.empty()) {
    const ssize_t written = ::write(fd, text.data(), text.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;
    text.remove_prefix(static_cast<std::size_t>(written));
  }
  return 0;
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
  Fd root;  // the writable tier; not ok(): memory-only
};

DiskCache::DiskCache(DiskCacheConfig config) : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  if (impl_->config.root) impl_->root = open_writable_root(*impl_->config.root);
}

DiskCache::~DiskCache() = default;

std::optional<Entry> DiskCache::load(const Key& key) {
  if (writable()) {
    if (auto entry = load_from(impl_->root.get(), *impl_->config.root, key, /*writable=*/true)) {
      return entry;
    }
  }
  for (const fs::path& ro_root : impl_->config.ro_roots) {
    const Fd tier(::open(ro_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!tier.ok() && !is_plain_miss(tier.error())) {
      warn_once(ro_root.string(),
                fmt::format("cannot read the read-only cache directory {} ({}); it is skipped; "
                            "fix it or drop it from KILN_CACHE_RO_DIRS",
                            ro_root.string(), describe(tier.error())));
    }
    if (!tier.ok()) continue;
    if (auto entry = load_from(tier.get(), ro_root, key, /*writable=*/false)) return entry;
  }
  return std::nullopt;
}

void DiskCache::store(const Entry& entry) {
  if (!writable()) return;
  const fs::path& root = *impl_->config.root;
  fs::path shard_path;
  const Fd shard = open_shard(impl_->root.get(), root, entry.key, /*create=*/true, shard_path);
  if (!shard.ok()) return warn_store_failed(root, shard_path, shard.error());
  const std::string name = entry_file(entry.key);
  if (const int error =
          publish(shard.get(), name, [&](int fd) { return write_entry(fd, entry); })) {
    return warn_store_failed(root, shard_path / name, error);
  }
  if (impl_->config.max_bytes > 0) evict(impl_->root.get(), impl_->config.max_bytes, entry.key);
}

void DiskCache::remove(const Key& key) {
  if (!writable()) return;
  fs::path shard_path;
  const Fd shard = open_shard(impl_->root.get(), *impl_->config.root, key, false, shard_path);
  if (shard.ok()) ::unlinkat(shard.get(), entry_file(key).c_str(), 0);
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
  fs::path shard_path;
  const Fd shard = open_shard(impl_->root.get(), *impl_->config.root, key, true, shard_path);
  if (!shard.ok()) return Lock();
  const std::string name = key.hex() + std::string(kLockSuffix);
  Fd file(
      ::openat(shard.get(), name.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, kFileMode));
  if (!file.ok()) return Lock();
  while (::flock(file.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return Lock();
  }
  return Lock(file.release());
}

std::optional<std::string> DiskCache::read_note(std::string_view name) const {
  const std::vector<std::string> parts = note_parts(name);
  if (!writable()) return std::nullopt;
  const Fd dir = open_note_dir(impl_->root.get(), parts, /*create=*/false);
  if (!dir.ok()) return std::nullopt;
  // NOTE: O_NONBLOCK so that a FIFO planted under the note's name cannot block the open.
  const Fd file(
      ::openat(dir.get(), parts.back().c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!file.ok()) return std::nullopt;
  return read_text(file.get(), kMaxNoteBytes);
}

void DiskCache::write_note(std::string_view name, std::string_view text) {
  const std::vector<std::string> parts = note_parts(name);
  if (!writable()) return;
  const Fd dir = open_note_dir(impl_->root.get(), parts, /*create=*/true);
  const int error =
      dir.ok() ? publish(dir.get(), parts.back(), [&](int fd) { return write_text(fd, text); })
               : dir.error();
  if (error == 0) return;
  const fs::path path = *impl_->config.root / version_dir() / name;
  warn_once("cache-note:" + path.string(),
            fmt::format("cannot write the cache note {} ({}); kiln works without it, only "
                        "slower to start; make {} writable or remove what is in the way",
                        path.string(), describe(error), impl_->config.root->string()));
}

bool DiskCache::writable() const {
  return impl_->root.ok();
}

const std::optional<std::filesystem::path>& DiskCache::root() const {
  return impl_->config.root;
}

const std::vector<std::filesystem::path>& DiskCache::ro_roots() const {
  return impl_->config.ro_roots;
}

std::vector<EntryStatus> DiskCache::list(bool verify_entries) const {
  std::vector<EntryStatus> statuses;
  if (!writable()) return statuses;
  const fs::path version_path = *impl_->config.root / version_dir();
  for (const TierFile& file : tier_entries(impl_->root.get())) {
    EntryStatus status;
    status.path = version_path / file.shard / file.name;
    status.key = Key::from_hex(
        std::string_view(file.name).substr(0, file.name.size() - kEntrySuffix.size()));
    status.size = static_cast<std::uint64_t>(file.info.st_size);
    status.last_used = file.info.st_mtim.tv_sec;
    if (verify_entries) verify(impl_->root.get(), file, status);
    statuses.push_back(std::move(status));
  }
  std::sort(statuses.begin(), statuses.end(),
            [](const EntryStatus& a, const EntryStatus& b) { return a.path < b.path; });
  return statuses;
}

std::vector<std::string> DiskCache::other_formats() const {
  std::vector<std::string> names;
  if (!writable()) return names;
  for (std::string& name : dir_names(impl_->root.get())) {
    struct stat info {};
    if (is_other_format_dir(name) &&
        ::fstatat(impl_->root.get(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISDIR(info.st_mode) || S_ISLNK(info.st_mode))) {
      names.push_back(std::move(name));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::uint64_t DiskCache::size_bytes() const {
  std::uint64_t total = 0;
  for (const EntryStatus& status : list(/*verify=*/false)) total += status.size;
  return total;
}

std::size_t DiskCache::prune(std::uint64_t max_bytes) {
  return writable() ? evict(impl_->root.get(), max_bytes, std::nullopt) : 0;
}

std::size_t DiskCache::remove_invalid() {
  std::size_t removed = 0;
  for (const EntryStatus& status : list(/*verify=*/true)) {
    if (status.valid) continue;
    const TierFile file{status.path.parent_path().filename().string(),
                        status.path.filename().string()};
    if (remove_file(impl_->root.get(), file) == 0) ++removed;
  }
  return removed;
}

std::size_t DiskCache::remove_other_formats() {
  std::size_t removed = 0;
  for (const std::string& name : other_formats()) {
    if (remove_tree(impl_->root.get(), name)) ++removed;
  }
  return removed;
}

std::size_t DiskCache::clear() {
  if (!writable()) return 0;
  std::size_t removed = 0;
  for (const TierFile& file : tier_files(impl_->root.get())) {
    const bool is_entry = file.name.ends_with(kEntrySuffix);
    if (!is_entry && !file.name.ends_with(kTempSuffix) && !file.name.ends_with(kLockSuffix)) {
      continue;
    }
    if (remove_file(impl_->root.get(), file) == 0 && is_entry) ++removed;
  }
  // Empty shard directories go too; one still in use is not empty and stays.
  if (const Fd version = open_subdir(impl_->root.get(), version_dir()); version.ok()) {
    for (const std::string& name : dir_names(version.get())) {
      if (is_shard_dir(name)) ::unlinkat(version.get(), name.c_str(), AT_REMOVEDIR);
    }
  }
  return removed;
}

}  // namespace kiln::detail
