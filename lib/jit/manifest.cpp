// SPDX-License-Identifier: Apache-2.0
// Manifests: reading and parsing lists of kernel specs.
#include "jit/manifest.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/user_text.hpp"
#include "kiln/error.hpp"
#include "kiln/target.hpp"
#include "params/registry.hpp"

namespace kiln::detail {
namespace {

std::string_view trim(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

// The file `file` that a manifest in `dir` names for a variant's code. NOTE: kept to `dir`, so
// that a manifest, which may come from elsewhere, cannot have kiln read any file its reader can
// and print its hash.
std::filesystem::path variant_file(const std::filesystem::path& dir, std::string_view file) {
  const auto outside = [&](std::string_view how) {
    return Error(ErrorCategory::invalid_argument,
                 fmt::format("the variant file '{}' {} the manifest's directory: a manifest names "
                             "its variants' files relative to its directory, and inside it; copy "
                             "the file there",
                             printable(file), how));
  };
  if (!is_safe_relative(file)) throw outside("leaves");
  const std::filesystem::path path = dir / file;
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) return path;  // missing, or why it cannot be read: read_variant() says
  const std::filesystem::path real_dir = std::filesystem::canonical(dir.empty() ? "." : dir, ec);
  if (ec || !is_within(real, real_dir)) {
    throw outside(
        fmt::format("resolves through a symbolic link to {}, outside", printable(real.string())));
  }
  return real;
}

}  // namespace

Variant read_variant(std::string_view name, const std::filesystem::path& file) {
  if (!is_identifier(name)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("variant name '{}' must be a C++ identifier", printable(name)));
  }
  std::optional<std::string> code = read_user_file(file, "variant code");
  if (!code) {
    throw Error(ErrorCategory::not_found,
                fmt::format("variant {}'s code file {} does not exist: name the file that holds "
                            "its struct kiln_variant",
                            name, printable(file.string())));
  }
  return Variant{.name = std::string(name), .code = std::move(*code)};
}

std::vector<KernelSpec> parse_manifest(std::string_view text, std::string_view name,
                                       const std::filesystem::path& dir) {
  std::vector<KernelSpec> specs;
  std::vector<Variant> variants;
  for (std::size_t number = 1, start = 0; start < text.size(); ++number) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    const std::string_view spec = trim(line.substr(0, line.find('#')));
    if (spec.empty()) continue;
    try {
      if (spec.starts_with("variant ")) {
        // `variant NAME FILE`, FILE relative to `dir` and inside it.
        const std::string_view rest = trim(spec.substr(8));
        const std::size_t space = rest.find(' ');
        if (space == std::string_view::npos) {
          throw Error(ErrorCategory::invalid_argument,
                      fmt::format("'{}' must be `variant NAME FILE`: NAME a C++ identifier, FILE "
                                  "the file holding its code, relative to the manifest",
                                  printable(spec)));
        }
        variants.push_back(
            read_variant(rest.substr(0, space), variant_file(dir, trim(rest.substr(space)))));
        continue;
      }
      specs.push_back(parse_spec(spec, variants));
      // NOTE: checked here as well as before compiling, so that a bad line fails the whole
      // manifest up front, named by its line.
      check_schema(specs.back());
      // A target that is none fails with the one it probably meant (an empty one is the
      // runtime's).
      if (!specs.back().target.empty()) static_cast<void>(Target(specs.back().target));
    } catch (const Error& e) {
      throw Error(e.category(), fmt::format("{}:{}: {}", printable(name), number, e.what()));
    }
  }
  return specs;
}

std::vector<KernelSpec> read_manifest(const std::filesystem::path& path) {
  const std::optional<std::string> text = read_user_file(path, "manifest");
  if (!text) {
    throw Error(ErrorCategory::not_found,
                fmt::format("the manifest {} does not exist: name a file of canonical specs, one "
                            "a line",
                            printable(path.string())));
  }
  return parse_manifest(*text, path.string(), path.parent_path());
}

}  // namespace kiln::detail
