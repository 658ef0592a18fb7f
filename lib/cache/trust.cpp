// The owner and mode rules for cache directories and files (trust.hpp).
#include "cache/trust.hpp"

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

}  // namespace

std::string untrusted_path(const fs::path& path, const struct stat& info, uid_t euid,
                           TrustPlace place) {
  if (place == TrustPlace::above) {
    if ((info.st_mode & S_IWOTH) == 0 || (info.st_mode & S_ISVTX) != 0) return {};
    return fmt::format(
        "{}, above the cache, is writable by everyone and not sticky (mode {}), so anyone could "
        "replace the cache directory: run `chmod o-w {}` or `chmod +t {}`, or move the cache",
        path.string(), mode_text(info), path.string(), path.string());
  }
  const bool file = place == TrustPlace::file;
  const std::string_view harm =
      file ? "rewrite the kernel binary in it" : "plant a kernel binary there";
  if (info.st_uid != euid && info.st_uid != 0) {
    return fmt::format(
        "{} belongs to uid {}, not to this user (uid {}) or root, so its owner could {}: run "
        "`chown {} {}` as root, or use a {} of your own",
        path.string(), info.st_uid, euid, harm, euid, path.string(), file ? "cache" : "directory");
  }
  if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return fmt::format(
        "{} is writable by {} (mode {}), so another user could {}: run `chmod go-w {}`",
        path.string(), other_writers(info), mode_text(info), harm, path.string());
  }
  return {};
}

std::string untrusted_above(const fs::path& root) {
  std::error_code error;
  const fs::path real = fs::canonical(root, error);
  if (error) {
    return fmt::format("the real path of {} cannot be found ({})", root.string(), error.message());
  }
  for (fs::path dir = real.parent_path();; dir = dir.parent_path()) {
    struct stat info {};
    if (::stat(dir.c_str(), &info) != 0) {
      return fmt::format("{}, above the cache, cannot be checked ({})", dir.string(),
                         std::generic_category().message(errno));
    }
    if (std::string why = untrusted_path(dir, info, ::geteuid(), TrustPlace::above); !why.empty()) {
      return why;
    }
    if (dir == dir.parent_path()) return {};
  }
}

}  // namespace kiln::detail
