// SPDX-License-Identifier: Apache-2.0
// Whom a directory or file kiln reads or writes lets plant code: the owner and mode rules kiln
// holds the cache, the spec record and the compile dumps to.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "cache/file_io.hpp"

namespace kiln::detail {

// Where a path stands relative to what it holds (a cache tier, say).
enum class TrustPlace {
  tier,   // the tier's root or a directory below it: it holds what kiln loads
  above,  // a directory above the root: whoever can write it can rename the root and replace it
  file,   // a file in a tier (an entry, a note): whoever can write it can rewrite what kiln loads
};

// What the checked paths hold, in the words of the reasons that refuse them.
struct Guarded {
  std::string_view place;      // what a directory above holds: "the cache"
  std::string_view dir_harm;   // what another writer of a directory could do
  std::string_view file_harm;  // what another writer of a file could do
};
inline constexpr Guarded kCacheGuarded{"the cache", "plant a kernel binary there",
                                       "rewrite the kernel binary in it"};

// Why kiln must not use `path`, whose stat is `info`, in a process whose effective user is
// `euid`, to hold `guarded`; empty when it may. The reason names `path` and ends with the fix.
//
// A tier's directory or file must belong to `euid` or root, the only users who may write it
// whatever its modes say, and be writable by neither group nor others. A directory above a tier
// need only not be writable by everyone, unless it is sticky (/tmp), where no one else may
// rename what they do not own. Group-writable directories above a tier are common (umask 002),
// and whoever can replace the root through one of them can only put there a directory that
// passes these checks: one that `euid` or root owns and no one else may write.
std::string untrusted_path(const std::filesystem::path& path, const struct stat& info, uid_t euid,
                           TrustPlace place, const Guarded& guarded = kCacheGuarded);

// As untrusted_path for the open directory or file `fd` at `path`.
std::string untrusted_open(int fd, const std::filesystem::path& path, TrustPlace place,
                           const Guarded& guarded = kCacheGuarded);

// The first directory above `root`, from its parent up to "/" by their real paths, that kiln
// must not trust (TrustPlace::above): why, or empty when none.
std::string untrusted_above(const std::filesystem::path& root,
                            const Guarded& guarded = kCacheGuarded);

// A directory kiln writes in: its descriptor, or the errno of the call that failed, or why it
// must not be used (then no descriptor).
struct CheckedDir {
  Fd fd;
  std::string untrusted;
};

// The directory `dir`, which may be a link (the user named it), held with every directory above
// it to the rules for a directory above what it holds (TrustPlace::above).
CheckedDir open_checked_parent(const std::filesystem::path& dir, const Guarded& guarded);

// The directory `name` in `parent`, the open directory at `parent_path`, created with `mode`
// where missing, never reached through a link, and held to the rules for a tier's directory
// (TrustPlace::tier).
CheckedDir open_checked_subdir(int parent, const std::filesystem::path& parent_path,
                               const std::string& name, mode_t mode, const Guarded& guarded);

}  // namespace kiln::detail
