// Finds kernels_src at run time and gathers a kernel's include closure.
#include "jit/sources.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "jit/embedded.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

std::optional<std::string> embedded_file(std::span<const EmbeddedFile> files,
                                         std::string_view path) {
  for (const EmbeddedFile& file : files) {
    if (path == file.path) return std::string(file.content);
  }
  return std::nullopt;
}

// <dir of libkiln>/<KILN_KERNELS_FROM_LIBDIR>, if libkiln is a shared library beside one.
std::optional<std::filesystem::path> installed_tree() {
  Dl_info info{};
  static const int anchor = 0;
  if (dladdr(&anchor, &info) == 0 || info.dli_fname == nullptr) return std::nullopt;
  std::error_code ec;
  const auto library = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) return std::nullopt;
  const auto tree = library.parent_path() / KILN_KERNELS_FROM_LIBDIR;
  if (!std::filesystem::is_directory(tree, ec)) return std::nullopt;
  return tree;
}

bool is_safe_relative(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  const std::filesystem::path p(path);
  return std::none_of(p.begin(), p.end(), [](const auto& part) { return part == ".."; });
}

}  // namespace

std::vector<std::string> quoted_includes(std::string_view text) {
  std::vector<std::string> includes;
  std::istringstream lines{std::string(text)};
  std::string line;
  while (std::getline(lines, line)) {
    std::string_view rest = line;
    auto skip_space = [&] {
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    };
    skip_space();
    if (rest.empty() || rest.front() != '#') continue;
    rest.remove_prefix(1);
    skip_space();
    if (!rest.starts_with("include")) continue;
    rest.remove_prefix(7);
    skip_space();
    if (rest.empty() || rest.front() != '"') continue;
    const std::size_t end = rest.find('"', 1);
    if (end == std::string_view::npos) continue;
    includes.emplace_back(rest.substr(1, end - 1));
  }
  return includes;
}

SourceTree SourceTree::locate(const std::optional<std::filesystem::path>& dir) {
  if (dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(*dir, ec)) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("kernel source directory '{}' (Options::kernels_dir or "
                              "KILN_KERNELS_DIR) is not a directory: point it at a kernels_src "
                              "tree, or unset it to use the installed sources",
                              dir->string()));
    }
    return SourceTree(*dir);
  }
  if (auto tree = installed_tree()) return SourceTree(*tree);
  return SourceTree({});
}

std::string SourceTree::describe() const {
  return root_.empty() ? std::string("the copy embedded in libkiln") : root_.string();
}

std::optional<std::string> SourceTree::read(std::string_view relative) const {
  if (root_.empty()) return embedded_file(embedded_kernels(), relative);
  std::ifstream in(root_ / relative, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

std::vector<Header> SourceTree::closure(std::string_view unit, std::string_view source) const {
  if (!is_safe_relative(source)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("kernel source '{}' must be a path inside kernels_src, such as "
                            "'elementwise/unary.cuh'",
                            source));
  }
  std::vector<Header> files;
  std::set<std::string, std::less<>> seen;
  auto visit = [&](std::string_view text) {
    for (std::string& include : quoted_includes(text)) {
      if (seen.contains(include)) continue;
      seen.insert(include);
      // Params headers always come from the library, so a swapped tree cannot change them.
      auto content = embedded_file(embedded_params(), include);
      if (!content && is_safe_relative(include)) content = read(include);
      if (content) files.push_back({std::move(include), std::move(*content)});
    }
  };
  visit(unit);
  if (std::none_of(files.begin(), files.end(), [&](const Header& h) { return h.name == source; })) {
    throw Error(ErrorCategory::not_found,
                fmt::format("kernel source '{}' is not in {}: check the spec's source, or "
                            "KILN_KERNELS_DIR",
                            source, describe()));
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    const std::string text = files[i].content;  // visit() may grow `files`
    visit(text);
  }
  return files;
}

}  // namespace kiln::detail
