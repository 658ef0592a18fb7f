// SPDX-License-Identifier: Apache-2.0
// The cache key: stable for equal inputs, different when anything that decides the binary does.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "jit/sources.hpp"
#include "jit/unit.hpp"
#include "kiln/attention.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.hpp"
#include "params/registry.hpp"
#include "stub_compiler.hpp"
#include "support.hpp"

namespace {

using kiln::test::StubCompiler;

// The key needs only the compiler's identity and options.
const StubCompiler kCompiler(kiln::Vendor::nvidia, "fake 1.0");

kiln::KernelSpec sample() {
  kiln::KernelSpec spec{.source = "elementwise/unary.cuh",
                        .entry = "kiln::unary",
                        .params = "kiln::UnaryParams",
                        .target = "sm_90a"};
  spec.set("block_size", 256).set("items_per_thread", 4).set("op", 4);
  spec.set("dtype", kiln::DType::f32);
  return spec;
}

std::filesystem::path source_tree() {
  return std::filesystem::path(KILN_SOURCE_DIR) / "kernels_src";
}

std::string key_of(const kiln::KernelSpec& spec, const std::filesystem::path& tree = source_tree(),
                   const StubCompiler& compiler = kCompiler) {
  const auto sources = kiln::detail::SourceTree::locate(tree);
  return kiln::detail::make_unit(spec, spec.target, sources, compiler).key.hex();
}

}  // namespace

TEST_CASE("equal inputs give equal keys of 32 hex digits", "[jit][key]") {
  const std::string key = key_of(sample());
  CHECK(key.size() == 32);
  CHECK(key.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(key_of(sample()) == key);
}

TEST_CASE("each field of the spec changes the key", "[jit][key]") {
  const std::string base = key_of(sample());
  auto changed = [&](auto&& edit) {
    kiln::KernelSpec spec = sample();
    edit(spec);
    return key_of(spec);
  };
  CHECK(changed([](auto& s) { s.set("block_size", 512); }) != base);
  CHECK(changed([](auto& s) { s.set("op", 5); }) != base);
  CHECK(changed([](auto& s) { s.set("dtype", kiln::DType::f64); }) != base);
  // A constant more: kiln's kernels refuse it (their schema), a kernel of one's own does not.
  const auto own = [](auto& s) { s.entry = "mine::unary"; };
  CHECK(changed([&](auto& s) {
          own(s);
          s.set("extra", true);
        }) != changed(own));
  CHECK(changed([](auto& s) { s.options.push_back("-DX=1"); }) != base);
  CHECK(changed([](auto& s) { s.target = "sm_80"; }) != base);
}

TEST_CASE("the compiler's identity changes the key", "[jit][key]") {
  CHECK(key_of(sample(), source_tree(), StubCompiler(kiln::Vendor::nvidia, "fake 1.0")) !=
        key_of(sample(), source_tree(), StubCompiler(kiln::Vendor::nvidia, "fake 1.1")));
}

TEST_CASE("the key depends on file content, not on where the tree is", "[jit][key]") {
  kiln::test::TempDir a, b;
  std::filesystem::copy(source_tree(), a.path() / "k", std::filesystem::copy_options::recursive);
  std::filesystem::copy(source_tree(), b.path() / "other",
                        std::filesystem::copy_options::recursive);
  const std::string key = key_of(sample(), a.path() / "k");
  CHECK(key_of(sample(), b.path() / "other") == key);

  SECTION("an edit to an included header changes it") {
    const auto prelude = b.path() / "other" / "common" / "prelude.cuh";
    kiln::test::write_file(prelude, kiln::test::read_file(prelude) + "\n// edited\n");
    CHECK(key_of(sample(), b.path() / "other") != key);
  }
  SECTION("an edit to a file the kernel does not include leaves it") {
    kiln::test::write_file(b.path() / "other" / "unrelated.cuh", "// not included\n");
    CHECK(key_of(sample(), b.path() / "other") == key);
  }
  SECTION("a tree cannot replace the Params header the library injects") {
    std::filesystem::create_directories(b.path() / "other" / "kiln" / "params");
    kiln::test::write_file(b.path() / "other" / "kiln" / "params" / "elementwise.h",
                           "struct Evil {};\n");
    CHECK(key_of(sample(), b.path() / "other") == key);
  }
}

TEST_CASE("equal inputs give equal keys across processes", "[jit][key]") {
  const std::string key = key_of(sample());
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    const std::string child = key_of(sample());
    const ssize_t written = write(fds[1], child.data(), child.size());
    _exit(written == static_cast<ssize_t>(child.size()) ? 0 : 1);
  }
  close(fds[1]);
  char buffer[64] = {};
  const ssize_t got = read(fds[0], buffer, sizeof buffer);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(std::string(buffer, static_cast<std::size_t>(std::max<ssize_t>(got, 0))) == key);
}

TEST_CASE("the include closure holds the source, its includes and the Params header",
          "[jit][key]") {
  const auto sources = kiln::detail::SourceTree::locate(source_tree());
  const auto unit = kiln::detail::make_unit(sample(), sample().target, sources, kCompiler);
  std::vector<std::string> names;
  for (const auto& header : unit.headers) names.push_back(header.name);
  CHECK(names == std::vector<std::string>{"kiln/params/elementwise.h", "elementwise/unary.cuh",
                                          "common/prelude.cuh", "common/vendor.cuh"});
}

TEST_CASE("editing one family's Params never changes another family's key", "[jit][key]") {
  // NOTE: the key hashes a kernel's include closure and nothing else from the tree (compute_key),
  // so a Params header outside the closure cannot change the key. A kernel may reach its own
  // family's header and the shared ones that header includes (score, KV layout), no other.
  const auto tree = kiln::detail::SourceTree::locate(source_tree());
  const auto params_headers = [&](std::string_view unit, std::string_view source) {
    std::set<std::string> names;
    for (const auto& header : tree.closure(unit, source)) {
      if (header.name.starts_with("kiln/params/")) names.insert(header.name);
    }
    return names;
  };
  std::vector<kiln::KernelSpec> specs = kiln::unary_default_specs();
  for (const char* target : {"sm_80", "sm_90a", "gfx90a"}) {
    for (kiln::KernelSpec& spec : kiln::default_specs(target)) specs.push_back(std::move(spec));
  }
  std::set<std::string> families;
  for (const kiln::KernelSpec& spec : specs) {
    INFO(kiln::to_string(spec));
    const kiln::detail::ParamsLayout& layout = kiln::detail::params_layout(spec.params);
    const std::string own(layout.header);
    families.insert(own);
    const std::set<std::string> allowed = params_headers("#include \"" + own + "\"\n", own);
    for (const std::string& header :
         params_headers(kiln::detail::render_source(spec, layout), spec.source)) {
      INFO(header);
      CHECK(allowed.contains(header));
    }
  }
  CHECK(families == std::set<std::string>{"kiln/params/attention.h",
                                          "kiln/params/attention_backward.h",
                                          "kiln/params/decode.h", "kiln/params/elementwise.h"});
}

TEST_CASE("bad specs are refused before compiling", "[jit][key]") {
  const auto category = [](auto&& edit) {
    kiln::KernelSpec spec = sample();
    edit(spec);
    try {
      key_of(spec);
    } catch (const kiln::Error& e) {
      return e.category();
    }
    FAIL("no error");
    return kiln::ErrorCategory::cache;
  };
  using kiln::ErrorCategory;
  CHECK(category([](auto& s) { s.source = "missing/kernel.cuh"; }) == ErrorCategory::not_found);
  CHECK(category([](auto& s) { s.source = "../etc/passwd"; }) == ErrorCategory::invalid_argument);
  CHECK(category([](auto& s) { s.entry = "kiln::unary<int>"; }) == ErrorCategory::invalid_argument);
  CHECK(category([](auto& s) { s.set("bad-name", 1); }) == ErrorCategory::invalid_argument);
  CHECK(category([](auto& s) { s.options.push_back("two words"); }) ==
        ErrorCategory::invalid_argument);
  CHECK(category([](auto& s) { s.target = "gfx90a"; }) == ErrorCategory::unsupported);
  CHECK(category([](auto& s) { s.params = "kiln::Nope"; }) == ErrorCategory::invalid_argument);
}

TEST_CASE("a refused target is named with the targets the compiler builds", "[jit][key]") {
  kiln::KernelSpec spec = sample();
  spec.target = "gfx942";
  CHECK_THROWS_WITH(key_of(spec), Catch::Contains("target 'gfx942' is not one fake 1.0 can "
                                                  "build for: use one of sm_80 sm_90a"));
}

// NOTE: any other option could make the compiler read a file the key does not cover.
TEST_CASE("a spec may add only options that change code generation", "[jit][key]") {
  for (const char* option :
       {"-DKILN_TRACE", "-DX=1", "-DX=\"a\"", "-UNDEBUG", "--use_fast_math", "-ffast-math",
        "-lineinfo", "--generate-line-info", "--extra-device-vectorization", "--maxrregcount=64",
        "-O0", "-O3", "--ftz=true", "--prec-div=false", "--prec-sqrt=true", "--fmad=false"}) {
    INFO(option);
    kiln::KernelSpec spec = sample();
    spec.options = {option};
    CHECK_NOTHROW(key_of(spec));
  }
  for (const char* option :
       {"--include-path=/etc", "--pre-include=passwd", "-I/etc", "-include", "-isystem/etc",
        "--pre-include", "-D", "-D1X", "-DX=a b", "-D=1", "--maxrregcount=", "--maxrregcount=x",
        "--ftz=yes", "-O4", "-U", "--dopt=on", "-Xclang", "--options-file=/etc/passwd", ""}) {
    INFO(option);
    kiln::KernelSpec spec = sample();
    spec.options = {option};
    try {
      key_of(spec);
      FAIL("accepted");
    } catch (const kiln::Error& e) {
      CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("option '" + std::string(option) + "' is not allowed"));
      CHECK_THAT(e.what(), Catch::Contains("-DNAME=VALUE"));
    }
  }
}

TEST_CASE("includes finds quoted, angle-bracket and computed includes", "[jit][key]") {
  using Kind = kiln::detail::Include::Kind;
  CHECK(kiln::detail::includes("#include \"a.cuh\"\n  #  include \"b/c.h\"\n"
                               "#include <cuda_fp16.h>\n// #include \"d.h\"\n"
                               "#include KILN_FILE \r\n#include_next <e.h>\n#define include\n") ==
        std::vector<kiln::detail::Include>{{"a.cuh", Kind::quoted},
                                           {"b/c.h", Kind::quoted},
                                           {"cuda_fp16.h", Kind::angled},
                                           {"KILN_FILE", Kind::computed},
                                           {"e.h", Kind::angled}});
}

TEST_CASE("a kernels dir that does not exist is an error naming it", "[jit][key]") {
  try {
    kiln::detail::SourceTree::locate(std::filesystem::path("/nonexistent/kernels"));
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK(e.category() == kiln::ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent/kernels"));
  }
}

namespace {

// The attention spec kiln would choose for sm_90a, running variant `v` of `code`.
kiln::KernelSpec attention_with_variant(const std::string& code) {
  kiln::KernelSpec spec = kiln::attention_default_specs(kiln::Target("sm_90a")).front();
  spec.target = "sm_90a";
  spec.variant_name = "v";
  spec.variant_code = code;
  return spec;
}

// The message the unit of attention_with_variant(code) is refused with (invalid_argument).
std::string refusal(const std::string& code) {
  try {
    key_of(attention_with_variant(code));
  } catch (const kiln::Error& e) {
    CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
    return e.what();
  }
  FAIL("no error for: " << code);
  return {};
}

}  // namespace

// NOTE: a variant's macros reach the kernels compiled after it: `static_assert` defined away
// would silence the Params layout check, `__syncthreads` a barrier.
TEST_CASE("variant code may #define and #undef only names of its own", "[jit][key][variant]") {
  const std::string kernel = "struct kiln_variant { static constexpr int k = 1; };\n";
  const std::pair<std::string, std::string> refused[] = {
      {"#define static_assert(...)\n", "line 1 #defines static_assert"},
      {"#define __syncthreads()\n", "line 1 #defines __syncthreads"},
      {"#define _Float 1\n", "line 1 #defines _Float"},
      {"#define sizeof(x) 4\n", "line 1 #defines sizeof"},
      {"#undef KILN_VENDOR_NVIDIA\n", "line 1 #undefs KILN_VENDOR_NVIDIA"},
      {"#define kiln_spec other\n", "line 1 #defines kiln_spec"},
      {"#define Kiln 1\n", "line 1 #defines Kiln"},
      // However the preprocessor lets the directive be written.
      {"int a;\n%: /* x */ define \\\n and &&\n", "line 2 #defines and"},
      {"# \\\ndefine final\n", "line 1 #defines final"},
  };
  for (const auto& [macro, why] : refused) {
    DYNAMIC_SECTION(macro) {
      const std::string message = refusal(macro + kernel);
      CHECK_THAT(message, Catch::Contains("variant v's " + why));
      CHECK_THAT(message, Catch::Contains("a variant may #define or #undef only names of its own"));
      CHECK_THAT(message, Catch::Contains("rename the macro"));
    }
  }
  // Its own names, and directives in comments and literals, are its business.
  CHECK_NOTHROW(key_of(attention_with_variant(
      "#define V_SCALE 2.0f\n#undef V_SCALE\n#define scale_ 1\n// #define static_assert\n"
      "/* #undef __syncthreads */ constexpr const char* s = \"#define KILN_X\";\n" +
      kernel)));
}

TEST_CASE("variant code with a NUL byte is refused, naming where it is", "[jit][key][variant]") {
  using namespace std::string_literals;
  CHECK_THROWS_WITH(key_of(attention_with_variant("struct kiln_variant {\n  int a;\0 };\n"s)),
                    Catch::Contains("variant v's code holds a NUL byte at line 2, column 9") &&
                        Catch::Contains("remove it"));
}
