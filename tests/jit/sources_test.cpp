// SPDX-License-Identifier: Apache-2.0
// The include closure: every file the compiler reads is one kiln read and keyed, or the spec is
// refused naming the include; and kernel files are read with bounds.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "core/user_text.hpp"
#include "jit/sources.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

// A copy of kernels_src whose elementwise/unary.cuh also has `line`, beside a file outside it.
class Tree {
 public:
  explicit Tree(const std::string& line) {
    fs::copy(fs::path(KILN_SOURCE_DIR) / "kernels_src", root(), fs::copy_options::recursive);
    test::write_file(dir_.path() / "outside.cuh", "#define OUTSIDE 1\n");
    const fs::path unary = root() / "elementwise" / "unary.cuh";
    test::write_file(unary, line + "\n" + test::read_file(unary));
  }
  fs::path root() const { return dir_.path() / "kernels"; }
  fs::path outside() const { return dir_.path() / "outside.cuh"; }

  // The message of the Error that gathering the unary kernel's closure throws, and its category.
  std::pair<std::string, ErrorCategory> refusal() const {
    const SourceTree tree = SourceTree::locate(root());
    try {
      tree.closure("#include \"elementwise/unary.cuh\"\n", "elementwise/unary.cuh");
    } catch (const Error& e) {
      return {e.what(), e.category()};
    }
    FAIL("no error");
    return {};
  }

 private:
  test::TempDir dir_;
};

void check_refused(const Tree& tree, ErrorCategory category, const std::string& include,
                   const std::string& why) {
  const auto [message, got] = tree.refusal();
  INFO(message);
  CHECK(got == category);
  CHECK_THAT(message, Catch::Contains("kernel file 'elementwise/unary.cuh' "));
  CHECK_THAT(message, Catch::Contains(include));
  CHECK_THAT(message, Catch::Contains(why));
}

TEST_CASE("an include that leaves the kernel tree is refused, naming it and its includer",
          "[jit]") {
  SECTION("an absolute path") {
    const Tree tree("#include \"/etc/hostname\"");
    check_refused(tree, ErrorCategory::invalid_argument, "\"/etc/hostname\"",
                  "leaves the kernel tree");
  }
  SECTION("a path up out of the tree") {
    const Tree tree("#include \"../outside.cuh\"");
    check_refused(tree, ErrorCategory::invalid_argument, "\"../outside.cuh\"",
                  "leaves the kernel tree");
  }
  SECTION("a symbolic link to a file outside it") {
    const Tree tree("#include \"common/outside.cuh\"");
    fs::create_symlink(tree.outside(), tree.root() / "common" / "outside.cuh");
    check_refused(tree, ErrorCategory::invalid_argument, "\"common/outside.cuh\"",
                  "resolves through a symbolic link to " + tree.outside().string());
  }
  SECTION("a link to /dev/zero") {
    const Tree tree("#include \"common/zero.cuh\"");
    fs::create_symlink("/dev/zero", tree.root() / "common" / "zero.cuh");
    check_refused(tree, ErrorCategory::invalid_argument, "\"common/zero.cuh\"", "/dev/zero");
  }
  SECTION("a quoted name the tree lacks, which NVRTC would look for in the working directory") {
    const Tree tree("#include \"stray.cuh\"");
    check_refused(tree, ErrorCategory::not_found, "\"stray.cuh\"", "which is not in ");
    // A probe for it is answered from the file system too.
    const Tree probe("#if __has_include(\"optional.cuh\")\n#endif");
    check_refused(probe, ErrorCategory::not_found, "\"optional.cuh\"", "which is not in ");
  }
  SECTION("a toolkit include by an absolute or upward path") {
    const Tree absolute("#include </etc/passwd>");
    check_refused(absolute, ErrorCategory::invalid_argument, "</etc/passwd>", "toolkit headers");
    const Tree upward("#include <../../etc/passwd>");
    check_refused(upward, ErrorCategory::invalid_argument, "<../../etc/passwd>", "toolkit headers");
  }
  SECTION("a computed include") {
    const Tree tree("#include KILN_FILE");
    check_refused(tree, ErrorCategory::invalid_argument, "(KILN_FILE)", "computed #include");
    const Tree probe("#if __has_include(KILN_FILE)\n#endif");
    check_refused(probe, ErrorCategory::invalid_argument, "(KILN_FILE)", "computed #include");
  }
}

// The compiler joins backslash-newlines and drops comments before it reads directives, takes
// %: for #, any horizontal space around the directive's name, and several directives or probes
// that read a file: each way of writing one is held to the same rules.
TEST_CASE("an include is refused however the preprocessor lets it be written", "[jit]") {
  const std::pair<const char*, const char*> forms[] = {
      {"/**/#include \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#/**/include \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#include/**/\"/etc/hostname\"", "\"/etc/hostname\""},
      {"#include /* a\n comment */ \"/etc/hostname\"", "\"/etc/hostname\""},
      {"int x; /* a\n comment */ #include \"/etc/hostname\"", "\"/etc/hostname\""},
      {"%:include \"/etc/hostname\"", "\"/etc/hostname\""},
      {" %: include \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#\\\ninclude \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#inc\\\nlude \\  \n\"/etc/hostname\"", "\"/etc/hostname\""},
      // GCC and clang join these lines; a compiler that does not sees the include.
      {"// a note \\ \n#include \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#include\f\"/etc/hostname\"", "\"/etc/hostname\""},
      {"\v#\vinclude\v\"/etc/hostname\"", "\"/etc/hostname\""},
      {"#include_next \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#include_next </etc/hostname>", "</etc/hostname>"},
      {"#import \"/etc/hostname\"", "\"/etc/hostname\""},
      {"#embed \"/etc/hostname\" limit(8)", "\"/etc/hostname\""},
      {"#if __has_include(\"/etc/hostname\")\n#endif", "\"/etc/hostname\""},
      {"#if defined(__has_include) && __has_include ( \"../outside.cuh\" )\n#endif",
       "\"../outside.cuh\""},
      {"#if __has_include_next(</etc/hostname>)\n#endif", "</etc/hostname>"},
      // What looks like a comment opening inside a raw string is none.
      {"auto s = R\"k(\"/*)k\";\n#include \"/etc/hostname\"\n// */", "\"/etc/hostname\""},
      // A digit separator opens no character literal that could hide a comment's end.
      {"int n = 1'000; /* x */ int m = 2'0;\n#include \"/etc/hostname\"", "\"/etc/hostname\""},
  };
  for (const auto& [line, include] : forms) {
    DYNAMIC_SECTION(printable(line)) {
      const Tree tree(line);
      check_refused(tree, ErrorCategory::invalid_argument, include, "leaves the kernel tree");
    }
  }
}

// The compiler reads a raw string only after a whole R, u8R, uR, UR or LR token and before a
// delimiter of at most 16 allowed characters that is closed later; an identifier ending in R
// (macro-made or not) is none. Each reading that kiln would otherwise take for a raw string,
// and so hide the include after it, must find the include.
TEST_CASE("an include after what only looks like a raw string is found", "[jit]") {
  const char* const forms[] = {
      // The issue's: a macro XR, so that the preprocessor never sees R"(.
      "#define XR\n#define S XR\"(\"\n#include \"/etc/hostname\"\n// )\"",
      "auto s = XR\"(\";\n#include \"/etc/hostname\"\n// )\"",
      "auto s = fooR\"(\";\n#include \"/etc/hostname\"\n// )\"",
      "auto s = u8fooR\"(\";\n#include \"/etc/hostname\"\n// )\"",
      // NVRTC reads \u00e9R as one identifier; clang reads $R and éR as one too.
      "auto s = \\u00e9R\"(\";\n#include \"/etc/hostname\"\n// )\"",
      "auto s = $R\"(\";\n#include \"/etc/hostname\"\n// )\"",
      "auto s = \xc3\xa9R\"(\";\n#include \"/etc/hostname\"\n// )\"",
      // NVRTC ignores a raw prefix whose delimiter is longer than 16 characters.
      "auto s = R\"abcdefghijklmnopq(\";\n#include \"/etc/hostname\"\n// )abcdefghijklmnopq\"",
      // A delimiter of characters the standard does not allow, and a raw string never closed,
      // are errors, read here as code.
      "auto s = R\"a b(\";\n#include \"/etc/hostname\"\n// )a b\"",
      "auto s = R\"(\n#include \"/etc/hostname\"",
      // clang ends a line at a lone CR, and so the comment.
      "// a note\r#include \"/etc/hostname\"",
  };
  for (const char* line : forms) {
    DYNAMIC_SECTION(printable(line)) {
      const Tree tree(line);
      check_refused(tree, ErrorCategory::invalid_argument, "\"/etc/hostname\"",
                    "leaves the kernel tree");
    }
  }
}

TEST_CASE("includes skips raw strings of every prefix and of delimiters up to 16 characters",
          "[jit]") {
  for (const char* prefix : {"R", "u8R", "uR", "UR", "LR"}) {
    INFO(prefix);
    CHECK(includes(std::string("auto s = ") + prefix +
                   "\"abcdefghijklmnop(\n#include \"/etc/hostname\"\n)abcdefghijklmnop\";\n")
              .empty());
  }
  // CR LF ends one line.
  CHECK(includes("// a note\r\n#include \"a.cuh\"\r\n") ==
        std::vector<Include>{{"a.cuh", Include::Kind::quoted}});
}

TEST_CASE("includes keeps the usual forms and skips comments and literals", "[jit]") {
  using Kind = Include::Kind;
  CHECK(includes("#include \"a.cuh\"\n"
                 "// #include \"/etc/one\"\n"
                 "/* #include \"/etc/two\"\n#include \"/etc/three\" */\n"
                 "const char* s = \"#include \\\"/etc/four\\\" /*\";\n"
                 "const char c = '\"'; const char d = '/';\n"
                 "auto r = R\"x(\n#include \"/etc/five\"\n)x\";\n"
                 "auto u = u8R\"(/*)\"; // */\n"
                 "#include <cuda_bf16.h>\n"
                 "%:include \"b/c.cuh\" // a comment\n"
                 "#include /* a\n comment */ \"d.cuh\"\n"
                 "#if __has_include(<cuda_fp8.h>)\n#endif\n"
                 "#define include\n#pragma once\n") ==
        std::vector<Include>{{"a.cuh", Kind::quoted},
                             {"cuda_bf16.h", Kind::angled},
                             {"b/c.cuh", Kind::quoted},
                             {"d.cuh", Kind::quoted},
                             {"cuda_fp8.h", Kind::angled}});
}

TEST_CASE("a kernel file with a NUL byte is refused, naming where it is", "[jit]") {
  using namespace std::string_literals;
  const Tree tree("int a;\0"s);
  const auto [message, category] = tree.refusal();
  CHECK(category == ErrorCategory::invalid_argument);
  CHECK_THAT(message, Catch::Contains("kernel file 'elementwise/unary.cuh' holds a NUL byte at "
                                      "line 1, column 7"));
}

TEST_CASE("a link inside the tree to a file inside it is followed", "[jit]") {
  const Tree tree("#include \"common/alias.cuh\"");
  fs::create_symlink(tree.root() / "common" / "prelude.cuh", tree.root() / "common" / "alias.cuh");
  const SourceTree sources = SourceTree::locate(tree.root());
  const auto files =
      sources.closure("#include \"elementwise/unary.cuh\"\n", "elementwise/unary.cuh");
  CHECK(std::any_of(files.begin(), files.end(),
                    [](const Header& h) { return h.name == "common/alias.cuh"; }));
}

TEST_CASE("an include that is a FIFO is refused at once, naming it", "[jit]") {
  const Tree tree("#include \"common/fifo.cuh\"");
  REQUIRE(mkfifo((tree.root() / "common" / "fifo.cuh").c_str(), 0600) == 0);
  const auto [message, category] = tree.refusal();
  CHECK(category == ErrorCategory::invalid_argument);
  CHECK_THAT(message, Catch::Contains("common/fifo.cuh is a FIFO"));
}

TEST_CASE("read_user_file reads regular files only, and only so much", "[jit]") {
  const test::TempDir dir;
  const fs::path file = dir.path() / "file.txt";
  test::write_file(file, "0123456789");
  CHECK(read_user_file(file, "manifest") == "0123456789");
  CHECK(read_user_file(dir.path() / "none", "manifest") == std::nullopt);
  CHECK_THROWS_WITH(read_user_file(file, "manifest", 9),
                    Catch::Contains("the manifest " + file.string() + " is larger than"));
  CHECK_THROWS_WITH(read_user_file(dir.path(), "manifest"),
                    Catch::Contains(dir.path().string() + " is a directory"));
  CHECK_THROWS_WITH(read_user_file("/dev/zero", "kernel file"),
                    Catch::Contains("the kernel file /dev/zero is a character device"));
  // /proc files say they are empty; what they hold is read all the same.
  CHECK_THAT(read_user_file("/proc/self/status", "manifest").value(), Catch::Contains("Pid:"));
}

TEST_CASE("printable escapes control characters and keeps the rest", "[jit]") {
  CHECK(printable("gfx90a\t\x1b[2J\n\x7f\xc3\xa9") == "gfx90a\t\\x1b[2J\\x0a\\x7f\xc3\xa9");
}

TEST_CASE("printable escapes C1 controls, alone or UTF-8 encoded, and keeps other UTF-8", "[jit]") {
  // 0x9b is CSI on a terminal that reads Latin-1; U+009B is the same on a UTF-8 one.
  CHECK(printable("a\x9b"
                  "2Jb") == "a\\x9b2Jb");
  CHECK(printable("a\xc2\x9b"
                  "2J\xc2\x85") == "a\\xc2\\x9b2J\\xc2\\x85");
  // U+00A0, U+00E9, U+2014 (0x80-0x9f as continuation bytes), U+1F600 stay as they are.
  CHECK(printable("\xc2\xa0\xc3\xa9\xe2\x80\x94\xf0\x9f\x98\x80") ==
        "\xc2\xa0\xc3\xa9\xe2\x80\x94\xf0\x9f\x98\x80");
  // A stray continuation byte, a truncated sequence and an overlong one are not characters.
  CHECK(printable("\x80|\xe2\x80|\xe0\x80\x80") == "\\x80|\xe2\\x80|\xe0\\x80\\x80");
}

TEST_CASE("printable echoes a long text by its ends, cut between characters", "[jit]") {
  // A 15 MB manifest line.
  const std::string line = "head" + std::string(15 << 20, 'x') + "\x1btail";
  const std::string shown = printable(line);
  CHECK(shown.size() < kMaxEchoBytes + 64);
  CHECK(shown.starts_with("headxxx"));
  CHECK(shown.ends_with("xxx\\x1btail"));
  CHECK_THAT(shown, Catch::Contains("xxx[... " + std::to_string(line.size() - kMaxEchoBytes) +
                                    " bytes not shown ...]xxx"));
  // A cut inside a character moves to its edge, at either end.
  const std::string half(kMaxEchoBytes / 2 - 1, 'a');
  CHECK(printable(half + "\xc3\xa9" + std::string(5000, 'b') + "\xc3\xa9" + half) ==
        half + "[... 5004 bytes not shown ...]" + half);
  CHECK(printable(std::string(kMaxEchoBytes, 'a')) == std::string(kMaxEchoBytes, 'a'));
}

TEST_CASE("require_no_nul names where the first NUL is", "[jit]") {
  CHECK_NOTHROW(require_no_nul("struct kiln_variant {};", "variant v's code"));
  using namespace std::string_literals;
  CHECK_THROWS_WITH(require_no_nul("struct kiln_variant {\n  int a;\0\n};"s, "variant v's code"),
                    Catch::Contains("variant v's code holds a NUL byte at line 2, column 9"));
  CHECK_THROWS_WITH(require_no_nul("\0"s, "kernel file 'a.cuh'"),
                    Catch::Contains("kernel file 'a.cuh' holds a NUL byte at line 1, column 1"));
}

}  // namespace
}  // namespace kiln::detail
