// The kernel source tree: where kernels_src is found at run time, and the include closure of a
// kernel file, handed to the compiler in memory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.hpp"

namespace kiln::detail {

class SourceTree {
 public:
  // Looks in order at `dir` (Options::kernels_dir or KILN_KERNELS_DIR), the share directory
  // installed beside libkiln, then the copy embedded in the library. A `dir` that does not exist
  // is an Error (not_found) rather than a silent fall-back to another tree.
  static SourceTree locate(const std::optional<std::filesystem::path>& dir);

  // Where files are read from; empty for the embedded copy.
  const std::filesystem::path& root() const { return root_; }
  std::string describe() const;

  // Every file that `unit` (a generated unit that includes `source`) reaches through
  // #include "..." and that resolves to a Params header injected by the library or to a file
  // of the tree, each once, in the order first reached. Quoted includes are relative to the
  // tree's root; anything else is left to the compiler. Throws kiln::Error (not_found) when
  // `source` itself is not in the tree.
  std::vector<Header> closure(std::string_view unit, std::string_view source) const;

 private:
  explicit SourceTree(std::filesystem::path root) : root_(std::move(root)) {}
  std::optional<std::string> read(std::string_view relative) const;

  std::filesystem::path root_;
};

// The quoted #include targets in `text`, in order of appearance.
std::vector<std::string> quoted_includes(std::string_view text);

}  // namespace kiln::detail
