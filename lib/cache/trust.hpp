// Whom a cache directory or file lets plant a binary: the owner and mode rules kiln holds it to.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <filesystem>
#include <string>

namespace kiln::detail {

// Where a path stands relative to a cache tier.
enum class TrustPlace {
  tier,   // the tier's root or a directory below it: it holds what kiln loads
  above,  // a directory above the root: whoever can write it can rename the root and replace it
  file,   // a file in a tier (an entry, a note): whoever can write it can rewrite what kiln loads
};

// Why kiln must not load binaries through `path`, whose stat is `info`, in a process whose
// effective user is `euid`; empty when it may. The reason names `path` and ends with the fix.
//
// A tier's directory or file must belong to `euid` or root, the only users who may write it
// whatever its modes say, and be writable by neither group nor others. A directory above a tier
// need only not be writable by everyone, unless it is sticky (/tmp), where no one else may
// rename what they do not own. Group-writable directories above a tier are common (umask 002),
// and whoever can replace the root through one of them can only put there a directory that
// passes these checks: one that `euid` or root owns and no one else may write.
std::string untrusted_path(const std::filesystem::path& path, const struct stat& info, uid_t euid,
                           TrustPlace place);

// The first directory above `root`, from its parent up to "/" by their real paths, that kiln
// must not trust (TrustPlace::above): why, or empty when none.
std::string untrusted_above(const std::filesystem::path& root);

}  // namespace kiln::detail
