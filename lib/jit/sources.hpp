// SPDX-License-Identifier: Apache-2.0
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
  // #include "...": a Params header injected by the library or a file of the tree, each once,
  // in the order first reached. Quoted includes are relative to the tree's root; angle-bracket
  // ones are left to the compiler's toolkit. Throws kiln::Error naming the include and the file
  // that has it for one the key could not cover: a quoted one not in the tree (not_found), or
  // one that leaves it, by an absolute or `..` path or a symbolic link, or a computed one
  // (invalid_argument).
  std::vector<Header> closure(std::string_view unit, std::string_view source) const;

 private:
  explicit SourceTree(std::filesystem::path root) : root_(std::move(root)) {}
  // nullopt when `relative` is not in the tree; `real_root` is the root with links resolved.
  std::optional<std::string> read(std::string_view relative, const std::filesystem::path& real_root,
                                  std::string_view from) const;

  std::filesystem::path root_;
};

struct Include {
  enum class Kind { quoted, angled, computed };  // "file", <file>, MACRO
  std::string name;                              // as written, without its delimiters
  Kind kind = Kind::quoted;

  friend bool operator==(const Include&, const Include&) = default;
};

// The files `text` makes the compiler read or probe, in order of appearance: the operands of
// #include and the other directives that read a file, however the preprocessor lets them be
// written (comments, joined lines, %:), and of __has_include and its kin.
std::vector<Include> includes(std::string_view text);

struct MacroDirective {
  std::string directive;  // "define" or "undef"
  std::string name;       // the macro's
  std::size_t line = 0;   // of the text, from 1

  friend bool operator==(const MacroDirective&, const MacroDirective&) = default;
};

// The #define and #undef directives of `text`, in order of appearance, found as includes() finds
// includes (not those in comments or literals; those however written).
std::vector<MacroDirective> macro_directives(std::string_view text);

}  // namespace kiln::detail
