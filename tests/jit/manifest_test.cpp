// SPDX-License-Identifier: Apache-2.0
// Manifests: a variant's file is kept to the manifest's directory, and a line is echoed bounded.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "core/user_text.hpp"
#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

namespace fs = std::filesystem;

constexpr const char* kCode = "struct kiln_variant {};\n";

// A manifest directory with a variant file in it and one below it, beside a file outside it.
class ManifestDir {
 public:
  ManifestDir() {
    fs::create_directories(dir() / "sub");
    test::write_file(dir() / "v.cuh", kCode);
    test::write_file(dir() / "sub" / "w.cuh", kCode);
    test::write_file(outside(), kCode);
  }
  fs::path dir() const { return root_.path() / "manifests"; }
  fs::path outside() const { return root_.path() / "outside.cuh"; }

  // The specs of a manifest of `text` in dir().
  std::vector<KernelSpec> read(const std::string& text) const {
    test::write_file(dir() / "manifest.txt", text);
    return read_manifest(dir() / "manifest.txt");
  }

 private:
  test::TempDir root_;
};

TEST_CASE("a manifest's variant files are its directory's", "[jit][manifest]") {
  const ManifestDir m;
  fs::create_symlink("sub/w.cuh", m.dir() / "alias.cuh");
  CHECK(m.read("variant v v.cuh\nvariant w sub/w.cuh\nvariant a alias.cuh\n").empty());
}

// NOTE: kiln prints a variant's hash, so a manifest naming any file would tell whoever wrote it
// the hash of any file its reader can read.
TEST_CASE("a manifest's variant file outside its directory is refused, naming it and the fix",
          "[jit][manifest]") {
  const ManifestDir m;
  const auto refusal = [&](const std::string& file) {
    try {
      m.read("# a comment\nvariant v " + file + "\n");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("manifest.txt:2: the variant file '" + file + "' "));
      CHECK_THAT(e.what(), Catch::Contains("relative to its directory, and inside it; copy the "
                                           "file there"));
      return std::string(e.what());
    }
    FAIL("no error for " << file);
    return std::string();
  };
  CHECK_THAT(refusal(m.outside().string()), Catch::Contains("leaves the manifest's directory"));
  CHECK_THAT(refusal("/etc/hostname"), Catch::Contains("leaves the manifest's directory"));
  CHECK_THAT(refusal("../outside.cuh"), Catch::Contains("leaves the manifest's directory"));
  CHECK_THAT(refusal("sub/../../outside.cuh"), Catch::Contains("leaves the manifest's directory"));
  fs::create_symlink(m.outside(), m.dir() / "link.cuh");
  CHECK_THAT(refusal("link.cuh"), Catch::Contains("resolves through a symbolic link to " +
                                                  fs::canonical(m.outside()).string() +
                                                  ", outside the manifest's directory"));
  fs::create_symlink("..", m.dir() / "up");
  CHECK_THAT(refusal("up/outside.cuh"), Catch::Contains("resolves through a symbolic link"));
}

TEST_CASE("a manifest line of 15 MB is echoed by its ends", "[jit][manifest]") {
  const std::string line = "attention " + std::string(15 << 20, 'x') + " end";
  try {
    parse_manifest("\n" + line + "\n", "m.txt");
    FAIL("no error");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(message.size() < 4 * kMaxEchoBytes);
    CHECK_THAT(message, Catch::Contains("m.txt:2: "));
    CHECK_THAT(message, Catch::Contains("attention xxx"));
    CHECK_THAT(message, Catch::Contains("bytes not shown ...]xxx"));
  }
}

}  // namespace
}  // namespace kiln::detail
