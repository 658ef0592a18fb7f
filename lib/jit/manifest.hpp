// Manifests: lists of kernel specs to warm, one canonical spec a line, as `kiln warm` reads them.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln::detail {

// One spec per line, as kiln::to_string prints it; `#` starts a comment, blank lines are
// skipped. Throws kiln::Error (invalid_argument) naming `name`, the line and what is wrong,
// a spec that does not match its kernel's schema (check_schema) included.
std::vector<KernelSpec> parse_manifest(std::string_view text, std::string_view name);

// The manifest at `path`. Throws kiln::Error naming it when it is missing, not a regular file,
// too large (kMaxUserFileBytes) or unreadable, and as parse_manifest() does.
std::vector<KernelSpec> read_manifest(const std::filesystem::path& path);

}  // namespace kiln::detail
