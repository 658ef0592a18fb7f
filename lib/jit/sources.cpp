// Finds kernels_src at run time and gathers a kernel's include closure.
#include "jit/sources.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "jit/embedded.hpp"
#include "jit/user_text.hpp"
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

// Whether `path` is `dir` or below it; both canonical.
bool is_within(const std::filesystem::path& path, const std::filesystem::path& dir) {
  return std::mismatch(dir.begin(), dir.end(), path.begin(), path.end()).first == dir.end();
}

// NOTE: the compiler reads whatever an include names and kiln does not hand it, and the key
// covers only what kiln hands it: an absolute or `..` path, or a name the compiler resolves by
// itself (a computed include), would be compiled but not keyed, so an edit to it would be served
// the stale binary. Angle-bracket includes are left to the toolkit, but only by toolkit-relative
// names.
void require_contained(const Include& include, std::string_view from) {
  if (include.kind == Include::Kind::computed) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} has a computed #include ({}): kiln cannot key a file chosen by a "
                            "macro; include it by its path in kernels_src, in quotes",
                            from, printable(include.name)));
  }
  if (is_safe_relative(include.name)) return;
  const bool quoted = include.kind == Include::Kind::quoted;
  throw Error(ErrorCategory::invalid_argument,
              fmt::format("{} includes {}{}{}, which leaves the kernel tree: {}", from,
                          quoted ? '"' : '<', printable(include.name), quoted ? '"' : '>',
                          quoted ? "name files of the tree relative to its root, such as "
                                   "\"common/prelude.cuh\", and copy outside files into it"
                                 : "include toolkit headers by their name, such as <cuda_fp16.h>"));
}

}  // namespace

std::vector<Include> includes(std::string_view text) {
  std::vector<Include> found;
  std::size_t start = 0;
  while (start < text.size()) {
    const std::size_t newline = std::min(text.find('\n', start), text.size());
    std::string_view rest = text.substr(start, newline - start);
    start = newline + 1;
    auto skip_space = [&] {
      while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    };
    skip_space();
    if (rest.empty() || rest.front() != '#') continue;
    rest.remove_prefix(1);
    skip_space();
    if (!rest.starts_with("include")) continue;
    rest.remove_prefix(7);
    // `#include_next` and any other word that merely starts with "include" is not an include.
    if (!rest.empty() && rest.front() != ' ' && rest.front() != '\t' && rest.front() != '"' &&
        rest.front() != '<') {
      continue;
    }
    skip_space();
    const char open = rest.empty() ? '\0' : rest.front();
    const std::size_t close = open == '"'   ? rest.find('"', 1)
                              : open == '<' ? rest.find('>', 1)
                                            : std::string_view::npos;
    if (close != std::string_view::npos) {
      found.push_back({std::string(rest.substr(1, close - 1)),
                       open == '"' ? Include::Kind::quoted : Include::Kind::angled});
    } else {
      while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\t' || rest.back() == '\r')) {
        rest.remove_suffix(1);
      }
      found.push_back({std::string(rest), Include::Kind::computed});
    }
  }
  return found;
}

SourceTree SourceTree::locate(const std::optional<std::filesystem::path>& dir) {
  if (dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(*dir, ec)) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("kernel source directory '{}' (Options::kernels_dir or "
                              "KILN_KERNELS_DIR) is not a directory: point it at a kernels_src "
                              "tree, or unset it to use the installed sources",
                              printable(dir->string())));
    }
    return SourceTree(*dir);
  }
  if (auto tree = installed_tree()) return SourceTree(*tree);
  return SourceTree({});
}

std::string SourceTree::describe() const {
  return root_.empty() ? std::string("the copy embedded in libkiln") : printable(root_.string());
}

std::optional<std::string> SourceTree::read(std::string_view relative,
                                            const std::filesystem::path& real_root,
                                            std::string_view from) const {
  if (root_.empty()) return embedded_file(embedded_kernels(), relative);
  const std::filesystem::path path = root_ / relative;
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::canonical(path, ec);
  if (ec) return read_user_file(path, "kernel file");  // missing, or why it cannot be read
  if (!is_within(real, real_root)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} includes \"{}\", which resolves through a symbolic link to {}, "
                            "outside the kernel tree {}: kiln keys only files inside the tree; "
                            "copy the file into it",
                            from, printable(relative), printable(real.string()), describe()));
  }
  return read_user_file(real, "kernel file");
}

std::vector<Header> SourceTree::closure(std::string_view unit, std::string_view source) const {
  if (!is_safe_relative(source)) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("kernel source '{}' must be a path inside kernels_src, such as "
                            "'elementwise/unary.cuh'",
                            printable(source)));
  }
  std::error_code ec;
  const std::filesystem::path real_root =
      root_.empty() ? root_ : std::filesystem::canonical(root_, ec);
  std::vector<Header> files;
  std::set<std::string, std::less<>> seen;
  auto visit = [&](std::string_view text, std::string_view from) {
    for (Include& include : includes(text)) {
      require_contained(include, from);
      if (include.kind != Include::Kind::quoted || seen.contains(include.name)) continue;
      seen.insert(include.name);
      // Params headers always come from the library, so a swapped tree cannot change them.
      auto content = embedded_file(embedded_params(), include.name);
      if (!content) content = read(include.name, real_root, from);
      if (!content) {
        // NOTE: NVRTC would look for it in the working directory, which the key cannot cover.
        throw Error(ErrorCategory::not_found,
                    include.name == source
                        ? fmt::format("kernel source '{}' is not in {}: check the spec's "
                                      "source, or KILN_KERNELS_DIR",
                                      printable(source), describe())
                        : fmt::format("{} includes \"{}\", which is not in {}: quoted includes "
                                      "name files of the kernel tree relative to its root; "
                                      "include toolkit headers with <...>",
                                      from, printable(include.name), describe()));
      }
      files.push_back({std::move(include.name), std::move(*content)});
    }
  };
  visit(unit, "the generated unit");
  for (std::size_t i = 0; i < files.size(); ++i) {
    const Header file = files[i];  // visit() may grow `files`
    visit(file.content, fmt::format("kernel file '{}'", printable(file.name)));
  }
  return files;
}

}  // namespace kiln::detail
