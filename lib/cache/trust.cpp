// SPDX-License-Identifier: Apache-2.0
// The owner and mode rules for the directories and files kiln trusts (trust.hpp).
#include "cache/trust.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <system_error>

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

std::string mode_text(const struct stat& info) {
  return fmt::format("{:04o}", info.st_mode & 07777);
}

// "group", "others" or "group and others": who besides the owner may write a path.
std::string other_writers(const struct stat& info) {
  const bool group = (info.st_mode & S_IWGRP) != 0;
  const bool others = (info.st_mode & S_IWOTH) != 0;
  if (group && others) return "group and others";
  return group ? "group" : "others";
}

// The first of `dir` and the directories above it, by their real paths up to "/", that breaks
// the rules for a directory above what it holds: why, or empty when none.
std::string untrusted_upward(const fs::path& dir, const Guarded& guarded) {
  std::error_code error;
  const fs::path real = fs::canonical(dir, error);
  if (error) {
    return fmt::format("the real path of {} cannot be found ({})", dir.string(), error.message());
  }
  for (fs::path up = real;; up = up.parent_path()) {
    struct stat info {};
    if (::stat(up.c_str(), &info) != 0) {
      return fmt::format("{}, above {}, cannot be checked ({})", up.string(), guarded.place,
                         describe(errno));
    }
    if (std::string why = untrusted_path(up, info, ::geteuid(), TrustPlace::above, guarded);
        !why.empty()) {
      return why;
    }
    if (up == up.parent_path()) return {};
  }
}

}  // namespace

std::string untrusted_path(const fs::path& path, const struct stat& info, uid_t euid,
                           TrustPlace place, const Guarded& guarded) {
  if (place == TrustPlace::above) {
    if ((info.st_mode & S_IWOTH) == 0 || (info.st_mode & S_ISVTX) != 0) return {};
    return fmt::format(
        "{}, above {}, is writable by everyone and not sticky (mode {}), so anyone could "
        "replace what it holds: run `chmod o-w {}` or `chmod +t {}`, or move {}",
        path.string(), guarded.place, mode_text(info), path.string(), path.string(), guarded.place);
  }
  const bool file = place == TrustPlace::file;
  const std::string_view harm = file ? guarded.file_harm : guarded.dir_harm;
  if (info.st_uid != euid && info.st_uid != 0) {
    return fmt::format(
        "{} belongs to uid {}, not to this user (uid {}) or root, so its owner could {}: run "
        "`chown {} {}` as root, or use one of your own",
        path.string(), info.st_uid, euid, harm, euid, path.string());
  }
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fmt::format(
        "{} is writable by {} (mode {}), so another user could {}: run `chmod go-w {}`",
        path.string(), other_writers(info), mode_text(info), harm, path.string());
  }
  return {};
}

std::string untrusted_open(int fd, const fs::path& path, TrustPlace place, const Guarded& guarded) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    return fmt::format("{} cannot be checked ({})", path.string(), describe(errno));
  }
  return untrusted_path(path, info, ::geteuid(), place, guarded);
}

std::string untrusted_above(const fs::path& root, const Guarded& guarded) {
  std::error_code error;
  const fs::path real = fs::canonical(root, error);
  if (error) {
    return fmt::format("the real path of {} cannot be found ({})", root.string(), error.message());
  }
  return untrusted_upward(real.parent_path(), guarded);
}

CheckedDir open_checked_parent(const fs::path& dir, const Guarded& guarded) {
  CheckedDir opened{Fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)), {}};
  if (opened.fd.ok()) opened.untrusted = untrusted_upward(dir, guarded);
  if (!opened.untrusted.empty()) opened.fd = Fd();
  return opened;
}

CheckedDir open_checked_subdir(int parent, const fs::path& parent_path, const std::string& name,
                               mode_t mode, const Guarded& guarded) {
  CheckedDir opened{make_subdir(parent, name, mode), {}};
  if (opened.fd.ok()) {
    opened.untrusted =
        untrusted_open(opened.fd.get(), parent_path / name, TrustPlace::tier, guarded);
  }
  if (!opened.untrusted.empty()) opened.fd = Fd();
  return opened;
}

}  // namespace kiln::detail
