// SPDX-License-Identifier: Apache-2.0
// Files kiln writes where another user may have been first: no link followed, no FIFO waited on,
// every file created exclusively under a name no one can guess, and published whole.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::detail {

// How the names of publish()'s temp files end.
inline constexpr std::string_view kTempSuffix = ".tmp";

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

// Writes all of `bytes` to `fd` from its current offset. Returns 0 or the errno of the failure.
int write_all(int fd, std::span<const std::byte> bytes);
int write_all(int fd, std::string_view text);

// The names in the open directory `dir`, but "." and "..".
std::vector<std::string> dir_names(int dir);

// The directory `name` in `dir`, never through a link: a link fails with ELOOP.
Fd open_subdir(int dir, const std::string& name);
// As open_subdir, creating the directory with `mode` where it is missing.
Fd make_subdir(int dir, const std::string& name, mode_t mode);

struct TempFile {
  std::string name;
  Fd fd;
};

// A new empty file of `mode` in `dir`, named `stem`, the pid, a random part and kTempSuffix, so
// that no one can plant a link or a FIFO under its name beforehand; created exclusively, never
// through a link.
TempFile create_temp(int dir, const std::string& stem, mode_t mode);

// Writes a temp file (create_temp) beside `name` with `write` (which returns an errno), syncs it,
// renames it over `name` and syncs the directory, so readers see the old file or the whole new
// one, never a part. Whatever was at `name` (a link, a FIFO) is replaced, never opened. Returns an
// errno.
template <class Write>
int publish(int dir, const std::string& name, mode_t mode, Write&& write) {
  TempFile temp = create_temp(dir, name, mode);
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

// What errno `error` means, saying "a symbolic link" for the ELOOP of O_NOFOLLOW, whose usual
// text misleads.
std::string describe(int error);

}  // namespace kiln::detail
