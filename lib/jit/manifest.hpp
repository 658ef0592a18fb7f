// SPDX-License-Identifier: Apache-2.0
// Manifests: lists of kernel specs to warm, one canonical spec a line, as `kiln warm` reads them.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln::detail {

// One spec per line, as kiln::to_string prints it; `#` starts a comment, blank lines are
// skipped. A line `variant NAME FILE` declares a user variant's code, the text of FILE (relative
// to `dir`), for the specs after it that name the variant ({variant NAME HASH}: the declaration
// of NAME whose code hashes to HASH). Throws kiln::Error (invalid_argument) naming `name`, the
// line and what is wrong, a spec that does not match its kernel's schema (check_schema) and a
// variant's file outside `dir` (an absolute or `..` path, or a symbolic link out of it) included,
// and (not_found) for a variant's file that does not exist or a spec whose variant is not
// declared.
std::vector<KernelSpec> parse_manifest(std::string_view text, std::string_view name,
                                       const std::filesystem::path& dir = {});

// The user variant `name` whose code is the text of `file`. Throws kiln::Error naming them
// (invalid_argument) when `name` is not a C++ identifier, (not_found) when `file` does not
// exist, and as read_user_file() does.
Variant read_variant(std::string_view name, const std::filesystem::path& file);

// The manifest at `path`, its variants' files relative to its directory. Throws kiln::Error
// naming it when it is missing, not a regular file, too large (kMaxUserFileBytes) or
// unreadable, and as parse_manifest() does.
std::vector<KernelSpec> read_manifest(const std::filesystem::path& path);

}  // namespace kiln::detail
