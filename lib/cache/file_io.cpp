// SPDX-License-Identifier: Apache-2.0
// Writing files that follow no link and wait on no FIFO (file_io.hpp).
#include "cache/file_io.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <system_error>

namespace kiln::detail {
namespace {

// With random names a clash means a leftover of a dead process or a planted file; retrying
// bounds how many of those a create steps over.
constexpr int kTempAttempts = 100;

// 64 bits no other user can predict; should the kernel refuse them, still distinct in this
// process.
std::uint64_t random_part() {
  std::uint64_t value = 0;
  if (::getrandom(&value, sizeof(value), GRND_NONBLOCK) == sizeof(value)) return value;
  static std::atomic<std::uint64_t> sequence{0};
  return sequence++ ^
         static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

}  // namespace

int write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t written = ::write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;
    bytes = bytes.subspan(static_cast<std::size_t>(written));
  }
  return 0;
}

int write_all(int fd, std::string_view text) {
  return write_all(fd, std::as_bytes(std::span(text)));
}

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

Fd make_subdir(int dir, const std::string& name, mode_t mode) {
  if (::mkdirat(dir, name.c_str(), mode) == 0) {
    ::fsync(dir);  // NOTE: so that after a crash no synced file is left without its directory
  } else if (errno != EEXIST) {
    return Fd(-1);
  }
  return open_subdir(dir, name);
}

TempFile create_temp(int dir, const std::string& stem, mode_t mode) {
  for (int attempt = 1;; ++attempt) {
    std::string name = fmt::format("{}.{}.{:016x}{}", stem, ::getpid(), random_part(), kTempSuffix);
    Fd fd(::openat(dir, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode));
    if (fd.ok() || fd.error() != EEXIST || attempt == kTempAttempts) {
      return {std::move(name), std::move(fd)};
    }
  }
}

std::string describe(int error) {
  if (error == ELOOP) return "it is a symbolic link, which kiln does not follow";
  return std::error_code(error, std::generic_category()).message();
}

}  // namespace kiln::detail
