// The include closure: every file the compiler reads is one kiln read and keyed, or the spec is
// refused naming the include; and kernel files are read with bounds.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>

#include "jit/sources.hpp"
#include "jit/user_text.hpp"
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
  }
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

}  // namespace
}  // namespace kiln::detail
