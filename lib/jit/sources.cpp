// SPDX-License-Identifier: Apache-2.0
// Finds kernels_src at run time and gathers a kernel's include closure.
#include "jit/sources.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "core/config.hpp"
#include "core/user_text.hpp"
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

constexpr std::string_view identifier_chars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\f' || c == '\v' || c == '\r';
}
bool is_identifier_char(char c) {
  return identifier_chars.find(c) != std::string_view::npos;
}

// NOTE: clang (hipRTC) takes '$' and UTF-8 letters into identifiers, NVRTC neither: a word is
// read as the longer of the two, so that `$R"(` or `éR"(` is no raw string here (which each
// compiler would read either as a raw string it then hides, or as an identifier that opens none).
// Where they differ this sees more code than one compiler does, never less.
std::size_t word_end(std::string_view text, std::size_t at) {
  while (at < text.size() && (is_identifier_char(text[at]) || text[at] == '$' ||
                              static_cast<unsigned char>(text[at]) >= 0x80)) {
    ++at;
  }
  return at;
}

// The encoding prefixes of a raw string literal, each a whole preprocessing token: `XR"(` is an
// identifier and an ordinary string, and hiding what follows it would hide it from kiln only.
bool is_raw_prefix(std::string_view word) {
  return word == "R" || word == "u8R" || word == "uR" || word == "UR" || word == "LR";
}

// Where the raw string whose R"... opens at `quote` (the quote's index) ends, or nullopt when
// the compiler reads no raw string there. NOTE: a delimiter of more than 16 characters makes
// NVRTC ignore the raw prefix and read on (so must kiln); one of characters the standard does
// not allow, or no closing at all, is a compile error, which kiln takes for no raw string, so
// that it sees more code than the compiler, never less.
std::optional<std::size_t> raw_string_end(std::string_view text, std::size_t quote) {
  constexpr std::size_t kMaxDelimiter = 16;
  std::size_t paren = quote + 1;
  while (paren < text.size() && paren - quote - 1 <= kMaxDelimiter && text[paren] != '(') {
    const char c = text[paren];
    if (c <= ' ' || c > '~' || c == ')' || c == '\\') return std::nullopt;
    ++paren;
  }
  if (paren >= text.size() || text[paren] != '(' || paren - quote - 1 > kMaxDelimiter) {
    return std::nullopt;
  }
  const std::string close = ")" + std::string(text.substr(quote + 1, paren - quote - 1)) + "\"";
  const std::size_t found = text.find(close, paren + 1);
  if (found == std::string_view::npos) return std::nullopt;
  return found + close.size();
}

// NOTE: every directive that makes the compiler read a file, by GCC's and clang's names
// (#include_next searches on from the current directory's place, #import is clang's and GCC's
// include-once, #embed reads a file as bytes): each is held to the rules of #include.
bool is_include_directive(std::string_view name) {
  return name == "include" || name == "include_next" || name == "import" || name == "embed";
}

// NOTE: __has_include and its kin ask the compiler whether a file exists, so the answer, and
// the code it selects, depends on the file system. Their operands are treated as includes: a
// quoted one must then be a file of the tree, which kiln hands the compiler (so it answers from
// a keyed file), and an angle-bracket one a toolkit-relative name. This refuses a probe for an
// optional file the tree lacks, which no kernel needs.
bool is_include_probe(std::string_view name) {
  return name == "__has_include" || name == "__has_include_next" || name == "__has_embed";
}

std::size_t count_newlines(std::string_view text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

struct PreprocessedText {
  std::string text;                 // as the compiler's directive handling sees it
  std::vector<std::size_t> probes;  // where, in `text`, each include probe's name ends
};

// Where the compilers may differ on what is one line. NOTE: GCC and clang join a backslash,
// spaces and a newline, and read a comment's newlines as no line end (`#include /*\n*/ "x"` is
// one directive; `x; /*\n*/ #include "x"` none); NVRTC does not document its choice, and each
// reading can see a directive the other does not, so both are checked.
enum class Reading { gnu, strict };

// `text` after translation phases 2 and 3 as they bear on directives: backslash-newlines
// joined, comments replaced by a space. Lines keep their numbers: a join's newlines (and in
// the gnu reading a comment's) are put back at the end of the line, and in the strict reading
// a comment's newlines stay where they were.
// String and character literals (raw ones too) are skipped, so a comment marker in one is not a
// comment; pp-numbers are skipped whole, so a digit separator (1'000) does not open a literal.
// Trigraphs (??= for #) are left out: kiln compiles as C++17, which has none.
// NOTE: a header name <a/*b> is lexed here as a comment, as it is everywhere but in an include;
// no toolkit header is so named, and the compiler fails on a missing include before compiling.
PreprocessedText preprocessed(std::string_view raw, Reading reading) {
  std::string joined;
  joined.reserve(raw.size());
  std::size_t held_newlines = 0;
  // NOTE: clang (hipRTC) also ends a line at a CR that no LF follows, NVRTC does not: it ends
  // one here, so that the include in `// x<CR>#include "f"` is the one clang reads.
  const auto is_newline = [&](std::size_t k) {
    return raw[k] == '\n' || (raw[k] == '\r' && (k + 1 == raw.size() || raw[k + 1] != '\n'));
  };
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\\') {
      std::size_t next = i + 1;
      while (reading == Reading::gnu && next < raw.size() && is_space(raw[next]) &&
             !is_newline(next)) {
        ++next;
      }
      if (next < raw.size() && is_newline(next)) {
        ++held_newlines;
        i = next;
        continue;
      }
    }
    if (is_newline(i)) {
      joined.append(held_newlines, '\n');
      held_newlines = 0;
      joined += '\n';
      continue;
    }
    joined += raw[i];
  }
  joined.append(held_newlines, '\n');
  held_newlines = 0;

  PreprocessedText out;
  std::string& code = out.text;
  code.reserve(joined.size());
  const std::string_view in = joined;
  std::size_t i = 0;
  // Copies a "..." or '...' literal that opens at i: it ends at its closing quote or its line.
  auto copy_literal = [&] {
    const char quote = in[i];
    std::size_t end = i + 1;
    while (end < in.size() && in[end] != quote && in[end] != '\n') end += in[end] == '\\' ? 2 : 1;
    end = std::min(end + (end < in.size() && in[end] == quote ? 1 : 0), in.size());
    code += in.substr(i, end - i);
    i = end;
  };
  while (i < in.size()) {
    const char c = in[i];
    if (in.substr(i).starts_with("//")) {
      code += ' ';
      i = std::min(in.find('\n', i), in.size());
    } else if (in.substr(i).starts_with("/*")) {
      const std::size_t close = in.find("*/", i + 2);
      const std::size_t end = close == in.npos ? in.size() : close + 2;
      code += ' ';
      const std::size_t newlines = count_newlines(in.substr(i, end - i));
      if (reading == Reading::gnu) {
        held_newlines += newlines;
      } else {
        code.append(newlines, '\n');
      }
      i = end;
    } else if (c == '"' || c == '\'') {
      copy_literal();
    } else if ((c >= '0' && c <= '9') ||
               (c == '.' && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '9')) {
      std::size_t end = i + 1;
      while (end < in.size()) {
        const char d = in[end];
        const bool sign = (d == '+' || d == '-') &&
                          std::string_view("eEpP").find(in[end - 1]) != std::string_view::npos;
        const bool separator = d == '\'' && end + 1 < in.size() && is_identifier_char(in[end + 1]);
        if (!is_identifier_char(d) && d != '.' && !sign && !separator) break;
        end += separator ? 2 : 1;
      }
      code += in.substr(i, end - i);
      i = end;
    } else if (word_end(in, i) > i) {
      const std::size_t end = word_end(in, i);
      const std::string_view word = in.substr(i, end - i);
      code += word;
      i = end;
      if (is_include_probe(word)) out.probes.push_back(code.size());
      // R"delim( ... )delim", with any encoding prefix: may hold quotes, newlines, comment marks.
      // Anything else is not raw, and its literal is copied next.
      const auto end_raw = is_raw_prefix(word) && i < in.size() && in[i] == '"'
                               ? raw_string_end(in, i)
                               : std::nullopt;
      if (end_raw) {
        // Only its newlines are kept, so a line in it that starts with # is not a directive.
        code += "\"\"";
        code.append(count_newlines(in.substr(i, *end_raw - i)), '\n');
        i = *end_raw;
      }
    } else {
      if (c == '\n') {
        code.append(held_newlines, '\n');
        held_newlines = 0;
      }
      code += c;
      ++i;
    }
  }
  code.append(held_newlines, '\n');
  return out;
}

struct Directive {
  std::string_view name;  // "include", "define", ...
  std::size_t end;        // where its name ends
};

// The directive on the line [start, newline) of preprocessed() code, if it holds one.
std::optional<Directive> directive_on(std::string_view code, std::size_t start,
                                      std::size_t newline) {
  std::size_t at = std::min(code.find_first_not_of(" \t\f\v\r", start), newline);
  if (code.substr(at).starts_with('#')) {
    at += 1;
  } else if (code.substr(at).starts_with("%:")) {
    at += 2;
  } else {
    return std::nullopt;
  }
  at = std::min(code.find_first_not_of(" \t\f\v\r", at), newline);
  const std::size_t end = std::min(code.find_first_not_of(identifier_chars, at), newline);
  return Directive{code.substr(at, end - at), end};
}

std::vector<Include> includes(std::string_view text, Reading reading) {
  std::vector<Include> found;
  const PreprocessedText seen = preprocessed(text, reading);
  const std::string_view code = seen.text;
  // The operand of an include or a probe, from `at`: a header name, or what a macro would expand.
  auto operand = [&](std::size_t at, std::string_view end_of_operand) {
    at = std::min(code.find_first_not_of(" \t\f\v\r", at), code.size());
    const char open = at < code.size() ? code[at] : '\0';
    const std::size_t close = open == '"'   ? code.find('"', at + 1)
                              : open == '<' ? code.find('>', at + 1)
                                            : std::string_view::npos;
    if (close != std::string_view::npos && code.substr(at, close - at).find('\n') == code.npos) {
      found.push_back({std::string(code.substr(at + 1, close - at - 1)),
                       open == '"' ? Include::Kind::quoted : Include::Kind::angled});
      return;
    }
    std::string_view rest = code.substr(at, code.find_first_of(end_of_operand, at) - at);
    while (!rest.empty() && is_space(rest.back())) rest.remove_suffix(1);
    // None at all is a compile error, which reads nothing (or `defined(__has_include)`).
    if (!rest.empty()) found.push_back({std::string(rest), Include::Kind::computed});
  };
  std::size_t probe = 0;  // the next of seen.probes
  for (std::size_t start = 0; start < code.size();) {
    const std::size_t newline = std::min(code.find('\n', start), code.size());
    // Probes on this line come before a directive on the next one.
    for (; probe < seen.probes.size() && seen.probes[probe] < newline; ++probe) {
      std::size_t at =
          std::min(code.find_first_not_of(" \t\f\v\r\n", seen.probes[probe]), code.size());
      at += at < code.size() && code[at] == '(' ? 1 : 0;
      at = std::min(code.find_first_not_of(" \t\f\v\r\n", at), code.size());
      operand(at, ")\n");
    }
    const std::optional<Directive> directive = directive_on(code, start, newline);
    start = newline + 1;
    if (directive && is_include_directive(directive->name)) operand(directive->end, "\n");
  }
  return found;
}

std::vector<MacroDirective> macro_directives(std::string_view text, Reading reading) {
  std::vector<MacroDirective> found;
  const std::string code = preprocessed(text, reading).text;
  std::size_t line = 1;  // preprocessed() keeps the lines' numbers
  for (std::size_t start = 0; start < code.size(); ++line) {
    const std::size_t newline = std::min(code.find('\n', start), code.size());
    const std::optional<Directive> directive = directive_on(code, start, newline);
    start = newline + 1;
    if (!directive || (directive->name != "define" && directive->name != "undef")) continue;
    const std::size_t at = std::min(code.find_first_not_of(" \t\f\v\r", directive->end), newline);
    const std::size_t end = std::min(word_end(code, at), newline);
    // None is a compile error.
    if (end > at) {
      found.push_back({std::string(directive->name), std::string(code.substr(at, end - at)), line});
    }
  }
  return found;
}

// What `find` finds in `text` read either way, each once.
template <class Find>
auto in_both_readings(std::string_view text, Find find) {
  auto found = find(text, Reading::gnu);
  for (auto& item : find(text, Reading::strict)) {
    if (std::find(found.begin(), found.end(), item) == found.end()) {
      found.push_back(std::move(item));
    }
  }
  return found;
}

}  // namespace

std::vector<Include> includes(std::string_view text) {
  return in_both_readings(text,
                          [](std::string_view t, Reading reading) { return includes(t, reading); });
}

std::vector<MacroDirective> macro_directives(std::string_view text) {
  return in_both_readings(
      text, [](std::string_view t, Reading reading) { return macro_directives(t, reading); });
}

SourceTree SourceTree::locate(const std::optional<std::filesystem::path>& dir) {
  if (dir) {
    std::error_code ec;
    if (!std::filesystem::is_directory(*dir, ec)) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("kernel source directory '{}' ({}) is not a directory: point it at "
                              "a kernels_src tree, or unset it to use the installed sources",
                              printable(dir->string()), knob_name(Knob::kernels_dir)));
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
      require_no_nul(*content, fmt::format("kernel file '{}'", printable(include.name)));
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
