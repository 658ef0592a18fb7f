// SPDX-License-Identifier: Apache-2.0
// Tests of the `kiln` command, run as a subprocess against a private cache directory.
#include <sys/stat.h>

#include <algorithm>

#include <fmt/format.h>
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cli/run_kiln.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "kiln/spec.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// Needs no GPU: NVRTC compiles for an explicit target.
constexpr const char* kSpec =
    "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
    "(kiln::UnaryParams) @sm_90a";
// Two specs without a target, so that `warm --target` supplies it; around a comment and a
// blank line, which the manifest allows.
constexpr const char* kManifest =
    "# two unary kernels\n"
    "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
    "(kiln::UnaryParams)\n"
    "\n"
    "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=5>"
    "(kiln::UnaryParams)   # cos\n";

// A spec complete but for its source file.
constexpr const char* kMissingSource =
    "elementwise/missing.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
    "(kiln::UnaryParams)";

// The built `kiln` with a scratch directory whose cache/ is its only cache, and no KILN_*
// variable of the calling environment.
class Cli {
 public:
  const fs::path& dir() const { return scratch_.path(); }
  fs::path cache() const { return scratch_.path() / "cache"; }

  Result run(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) const {
    return run_kiln(dir(), cache(), args, env);
  }

  // `kiln warm --target sm_90a` of the manifest, written to the scratch directory.
  Result warm_manifest(const std::vector<std::string>& env = {}) const {
    write_file(dir() / "manifest.txt", kManifest);
    return run({"warm", "--target", "sm_90a", (dir() / "manifest.txt").string()}, env);
  }

  // The manifest in the scratch directory, warmed for sm_90a; returns the report.
  nlohmann::json warm(const std::vector<std::string>& extra_args = {}) const {
    write_file(dir() / "manifest.txt", kManifest);
    std::vector<std::string> args{"warm", "--target", "sm_90a", "--report",
                                  (dir() / "report.json").string()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    args.push_back((dir() / "manifest.txt").string());
    const Result result = run(args);
    INFO(result.out << result.err);
    REQUIRE(result.code == 0);
    return nlohmann::json::parse(read_file(dir() / "report.json"));
  }

  std::vector<fs::path> entry_files() const {
    std::vector<fs::path> files;
    for (const auto& item : fs::recursive_directory_iterator(cache())) {
      if (item.path().extension() == ".kbin") files.push_back(item.path());
    }
    return files;
  }

 private:
  TempDir scratch_;
};

TEST_CASE("kiln info names the cache directory, the JIT mode and the build", "[cli]") {
  const Cli cli;
  fs::create_directory(cli.cache());
  const Result result = cli.run({"info", "--jit", "strict"});
  INFO(result.out << result.err);
  CHECK(result.code == 0);
  CHECK(contains(result.out, cli.cache().string() + " (0 entries, 0 B)"));
  CHECK(std::regex_search(result.out, std::regex("\njit +strict\n")));
  CHECK(contains(result.out, fmt::format("\nbuild           {}\n", kiln_build_id())));
}

TEST_CASE("kiln info and kiln cache create no cache, and a missing one is named, with the fix",
          "[cli]") {
  const Cli cli;
  const fs::path typo = cli.dir() / "TYPO";
  const std::string missing = "the cache directory " + typo.string() +
                              " does not exist: check --cache-dir and KILN_CACHE_DIR (kiln "
                              "creates it when it first stores a kernel)";
  for (const std::vector<std::string>& command : {std::vector<std::string>{"cache", "ls"},
                                                  {"cache", "stats"},
                                                  {"cache", "verify"},
                                                  {"cache", "prune", "--max-bytes", "1G"},
                                                  {"cache", "clear"}}) {
    CAPTURE(command);
    std::vector<std::string> args = command;
    args.insert(args.end(), {"--cache-dir", typo.string()});
    const Result result = cli.run(args);
    CHECK(result.code == 1);
    CHECK(contains(result.err, "kiln: error: " + missing + "\n"));
    CHECK(result.out.empty());
    CHECK_FALSE(fs::exists(typo));
    // From the environment, likewise.
    CHECK(cli.run(command).code == 1);
    CHECK_FALSE(fs::exists(cli.cache()));
  }
  const Result info = cli.run({"info", "--cache-dir", typo.string()});
  CHECK(info.code == 0);
  CHECK(contains(info.out, "\ncache           " + missing + "\n"));
  const Result json = cli.run({"info", "--json"});
  CHECK(json.code == 0);
  CHECK(nlohmann::json::parse(json.out)["cache"]["dir"] == cli.cache().string());
  CHECK_FALSE(fs::exists(typo));
  CHECK_FALSE(fs::exists(cli.cache()));

  // An existing root without this format's directory is an empty cache, and stays as it was.
  fs::create_directory(typo);
  const Result empty = cli.run({"cache", "ls", "--cache-dir", typo.string()});
  CHECK(empty.code == 0);
  CHECK(contains(empty.out, "0 entries, 0 B in " + typo.string()));
  CHECK(cli.run({"info", "--cache-dir", typo.string()}).code == 0);
  CHECK(fs::is_empty(typo));
}

TEST_CASE("kiln info --json reports backends, target, sources and cache", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result result = cli.run({"info", "--json", "--target", "gfx90a"});
  INFO(result.out << result.err);
  REQUIRE(result.code == 0);
  const auto json = nlohmann::json::parse(result.out);
  for (const char* key : {"version", "build", "backend", "backends", "target", "target_problem",
                          "kernels_dir", "cache", "jit"}) {
    CHECK(json.contains(key));
  }
  CHECK(json["build"] == kiln_build_id());
  CHECK(json["backend"] == "hip");
  CHECK(json["target"] == "gfx90a");
  REQUIRE(json["backends"].size() == 2);
  CHECK(json["backends"][0]["name"] == "cuda");
  CHECK(json["backends"][0]["compiler_found"] == true);
  CHECK(json["backends"][1]["name"] == "hip");
  CHECK(json["cache"]["dir"] == cli.cache().string());
  CHECK(json["cache"]["entries"] == 2);
  CHECK(json["cache"]["bytes"].get<std::uint64_t>() > 0);
  CHECK(json["jit"] == "on");
}

TEST_CASE("kiln warm compiles a manifest, then finds it on disk", "[cli]") {
  const Cli cli;
  const auto first = cli.warm();
  CHECK(first["counts"]["compiled"] == 2);
  CHECK(first["counts"]["failed"] == 0);
  REQUIRE(first["items"].size() == 2);
  CHECK(first["items"][0]["spec"] ==
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
        "(kiln::UnaryParams) @sm_90a");
  CHECK(first["compile_ms"].get<double>() > 0);
  CHECK(cli.entry_files().size() == 2);

  const Result second =
      cli.run({"warm", "--target", "sm_90a", (cli.dir() / "manifest.txt").string()});
  INFO(second.out << second.err);
  CHECK(second.code == 0);
  CHECK(contains(second.out, "warmed 2 kernels"));
  CHECK(contains(second.out, "memory 0  disk 2  compiled 0  failed 0"));
  // stderr is a file here, so progress comes as one line per item.
  CHECK(contains(second.err, "[1/2] disk"));
  CHECK(contains(second.err, "[2/2] disk"));

  const Result quiet =
      cli.run({"warm", "--quiet", "--target", "sm_90a", (cli.dir() / "manifest.txt").string()});
  CHECK(quiet.code == 0);
  CHECK(quiet.err.empty());
}

TEST_CASE("kiln warm builds every spec for each --target", "[cli]") {
  const Cli cli;
  const auto report = cli.warm({"--target", "sm_80"});
  CHECK(report["counts"]["compiled"] == 4);
  REQUIRE(report["items"].size() == 4);
  CHECK(report["items"][0]["spec"].get<std::string>().ends_with(" @sm_90a"));
  CHECK(report["items"][3]["spec"].get<std::string>().ends_with(" @sm_80"));
}

TEST_CASE("kiln warm names the file and line of a bad manifest line", "[cli]") {
  const Cli cli;
  const fs::path manifest = cli.dir() / "bad.txt";
  write_file(manifest, std::string(kManifest) + "elementwise/unary.cuh kiln::unary\n");
  const Result result = cli.run({"warm", "--target", "sm_90a", manifest.string()});
  CHECK(result.code == 2);
  CHECK(contains(result.err, "kiln: error: " + manifest.string() + ":5: cannot parse"));
  CHECK(!fs::exists(cli.cache() / "v1"));
}

TEST_CASE("kiln warm exits 1 and shows the message when a spec fails", "[cli]") {
  const Cli cli;
  const fs::path manifest = cli.dir() / "missing.txt";
  write_file(manifest, std::string(kMissingSource) + "\n");
  const Result result = cli.run({"warm", "--target", "sm_90a", manifest.string()});
  CHECK(result.code == 1);
  CHECK(contains(result.out, "failed 1"));
  CHECK(contains(result.out, "failed: elementwise/missing.cuh"));
}

TEST_CASE("kiln warm refuses a manifest that is not a regular file, naming it", "[cli]") {
  const Cli cli;
  const fs::path fifo = cli.dir() / "fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const fs::path& path : {fs::path("/dev/zero"), cli.dir(), fifo}) {
    const Result result = cli.run({"warm", "--target", "sm_90a", path.string()});
    CHECK(result.code == 2);
    CHECK(contains(result.err, "kiln: error: the manifest " + path.string() + " is a "));
    CHECK_FALSE(contains(result.out, "warmed"));
  }
  const Result missing = cli.run({"warm", (cli.dir() / "none.txt").string()});
  CHECK(missing.code == 1);
  CHECK(contains(missing.err, (cli.dir() / "none.txt").string() + " does not exist"));
}

TEST_CASE("kiln warm escapes the control characters of a bad manifest line", "[cli]") {
  const Cli cli;
  const fs::path manifest = cli.dir() / "escape.txt";
  write_file(manifest, "elementwise/unary.cuh:kiln::unary\x1b]0;owned\x07\x1b[2J<op=4>(p)\n");
  const Result result = cli.run({"warm", "--target", "sm_90a", manifest.string()});
  CHECK(result.code == 2);
  CHECK(contains(result.err, "unary\\x1b]0;owned\\x07\\x1b[2J<op=4>"));
  CHECK_FALSE(contains(result.err, "\x1b"));
}

TEST_CASE("kiln warm refuses an AMD target hipRTC cannot build, naming those it can", "[cli]") {
  KILN_REQUIRE_HIPRTC();
  const Cli cli;
  // hipRTC of ROCm 5.2 aborted the process in comgr for each of these; gfx9ff is no comgr's.
  for (const char* target : {"gfx942", "gfx9ff"}) {
    const Result result = cli.run({"warm", "--quiet", "--target", target});
    CHECK(result.code == 1);
    // Once, up front, not for each spec.
    CHECK(result.err.starts_with("kiln: error: target '" + std::string(target) +
                                 "' is not one hiprtc"));
    CHECK(contains(result.err, "gfx90a"));
    CHECK(result.out.empty());
  }
}

TEST_CASE("kiln compile prints the key, registers and log of one spec", "[cli]") {
  const Cli cli;
  const Result result = cli.run({"compile", "--source", kSpec});
  INFO(result.out << result.err);
  REQUIRE(result.code == 0);
  CHECK(std::regex_search(result.out, std::regex("\nkey +[0-9a-f]{32}\n")));
  CHECK(std::regex_search(result.out, std::regex("\nregisters +[0-9]+\n")));
  CHECK(std::regex_search(result.out, std::regex("\ntarget +sm_90a\n")));
  CHECK(contains(result.out, "generated source\n"));
  CHECK(contains(result.out, "elementwise/unary.cuh"));
  CHECK(cli.entry_files().size() == 1);
}

TEST_CASE("kiln compile explains a missing kernel source and exits 1", "[cli]") {
  const Cli cli;
  const Result result = cli.run({"compile", std::string(kMissingSource) + " @sm_90a"});
  CHECK(result.code == 1);
  CHECK(contains(result.err, "kiln: error: "));
  CHECK(contains(result.err, "elementwise/missing.cuh"));
  CHECK(result.out.empty());
}

TEST_CASE("kiln compile prints a compiler error in full and exits 1", "[cli]") {
  const Cli cli;
  const fs::path kernels = cli.dir() / "kernels";
  fs::copy(fs::path(KILN_SOURCE_DIR) / "kernels_src", kernels, fs::copy_options::recursive);
  const fs::path unary = kernels / "elementwise" / "unary.cuh";
  write_file(unary, read_file(unary) + "\nthis is not C++;\n");
  const Result result = cli.run({"compile", "--kernels-dir", kernels.string(), kSpec});
  CHECK(result.code == 1);
  CHECK(std::regex_search(result.err, std::regex("failed \\(key [0-9a-f]{32}\\)\n")));
  CHECK(contains(result.err, "options: --gpu-architecture=sm_90a"));
  CHECK(contains(result.err, "generated source: "));
  CHECK(contains(result.err, "this is not C++;"));
  CHECK(cli.entry_files().empty());
}

TEST_CASE("kiln compile refuses a malformed spec as a usage error", "[cli]") {
  const Cli cli;
  const Result result = cli.run({"compile", "not a spec"});
  CHECK(result.code == 2);
  CHECK(contains(result.err, "kiln: error: cannot parse kernel spec 'not a spec'"));
}

TEST_CASE("kiln cache ls lists every entry with its spec", "[cli]") {
  const Cli cli;
  const auto report = cli.warm();
  const Result result = cli.run({"cache", "ls"});
  INFO(result.out << result.err);
  REQUIRE(result.code == 0);
  for (const auto& item : report["items"]) {
    CHECK(contains(result.out, item["key"].get<std::string>()));
    CHECK(contains(result.out, item["spec"].get<std::string>()));
  }
  CHECK(contains(result.out, "2 entries"));

  const Result json = cli.run({"cache", "ls", "--json"});
  REQUIRE(json.code == 0);
  const auto entries = nlohmann::json::parse(json.out);
  REQUIRE(entries.size() == 2);
  CHECK(entries[0]["valid"] == true);
  CHECK(entries[0]["size"].get<std::uint64_t>() > 0);
}

TEST_CASE("kiln cache verify reports a corrupt entry and --fix removes it", "[cli]") {
  const Cli cli;
  cli.warm();
  const fs::path corrupt = cli.entry_files().at(0);
  std::string bytes = read_file(corrupt);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  write_file(corrupt, bytes);

  const Result found = cli.run({"cache", "verify"});
  CHECK(found.code == 1);
  CHECK(contains(found.out, "bad: " + corrupt.string()));
  CHECK(contains(found.out, "2 entries checked, 1 bad"));

  const Result fixed = cli.run({"cache", "verify", "--fix"});
  CHECK(fixed.code == 0);
  CHECK(contains(fixed.out, "removed 1 bad entries"));
  CHECK(!fs::exists(corrupt));
  CHECK(cli.entry_files().size() == 1);

  const Result clean = cli.run({"cache", "verify"});
  CHECK(clean.code == 0);
  CHECK(contains(clean.out, "1 entries checked, 0 bad"));
}

TEST_CASE("kiln cache prune evicts down to --max-bytes", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result kept = cli.run({"cache", "prune", "--max-bytes", "1G"});
  CHECK(kept.code == 0);
  CHECK(contains(kept.out, "removed 0 entries"));
  CHECK(cli.entry_files().size() == 2);

  const Result pruned = cli.run({"cache", "prune", "--max-bytes", "1"});
  CHECK(pruned.code == 0);
  CHECK(contains(pruned.out, "removed 2 entries"));
  CHECK(cli.entry_files().empty());

  const Result decimal = cli.run({"cache", "prune", "--max-bytes", "1.5g"});
  CHECK(decimal.code == 0);
  CHECK(contains(decimal.out, "(limit 1.5 GiB)"));

  const Result bad = cli.run({"cache", "prune", "--max-bytes", "12Q"});
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "--max-bytes is '12Q'"));
}

TEST_CASE("kiln cache prune refuses a --max-bytes beyond 64 bits and deletes nothing", "[cli]") {
  // 17179869184G is 2^64 bytes, which wrapped to a limit of 0 B and emptied the cache.
  const Cli cli;
  cli.warm();
  const Result result = cli.run({"cache", "prune", "--max-bytes", "17179869184G"});
  CHECK(result.code == 2);
  CHECK(contains(result.err, "--max-bytes is '17179869184G'"));
  CHECK(contains(result.err, "2^64 - 1"));
  CHECK(cli.entry_files().size() == 2);
}

TEST_CASE("kiln cache clear removes every entry", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result result = cli.run({"cache", "clear"});
  CHECK(result.code == 0);
  CHECK(contains(result.out, "removed 2 entries from " + cli.cache().string()));
  CHECK(cli.entry_files().empty());
  CHECK(contains(cli.run({"cache", "ls"}).out, "0 entries"));
}

TEST_CASE("kiln cache ls names other formats' directories and clear removes them", "[cli]") {
  const Cli cli;
  cli.warm();
  fs::create_directories(cli.cache() / "v0" / "ab");
  write_file(cli.cache() / "v0" / "ab" / "old.kbin", "another kiln's entry");
  const Result listed = cli.run({"cache", "ls"});
  CHECK(listed.code == 0);
  CHECK(contains(listed.out, "in formats this kiln does not read: v0"));
  const Result cleared = cli.run({"cache", "clear"});
  CHECK(cleared.code == 0);
  CHECK(contains(cleared.out, "removed 2 entries from " + cli.cache().string()));
  CHECK(contains(cleared.out, "removed 1 of 1 directories of other cache formats (v0)"));
  CHECK_FALSE(fs::exists(cli.cache() / "v0"));
  CHECK_FALSE(contains(cli.run({"cache", "ls"}).out, "formats this kiln does not read"));
}

TEST_CASE("kiln cache refuses a cache directory it cannot write", "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "file", "not a directory");
  const std::string unusable = (cli.dir() / "file" / "cache").string();
  const Result result = cli.run({"cache", "ls", "--cache-dir", unusable});
  CHECK(result.code == 1);
  CHECK(contains(result.err,
                 "kiln: error: the cache directory " + unusable + " cannot be created or written"));
}

TEST_CASE("kiln warm says where the kernels went and how full the cache is", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result result = cli.warm_manifest();
  INFO(result.out << result.err);
  CHECK(result.code == 0);
  CHECK(std::regex_search(result.out, std::regex("\ncache " + cli.cache().string() +
                                                 ": 2 entries, [0-9.]+ KiB \\(no cap: "
                                                 "KILN_CACHE_MAX_BYTES sets one\\)\n")));
  const Result capped = cli.warm_manifest({"KILN_CACHE_MAX_BYTES=1.5G"});
  CHECK(capped.code == 0);
  CHECK(contains(capped.out, " of a 1.5 GiB cap (KILN_CACHE_MAX_BYTES)\n"));
}

TEST_CASE("kiln warm builds a user variant's spec from the code its manifest declares",
          "[cli][variant]") {
  const Cli cli;
  const std::string code = R"(struct kiln_variant {
  static __device__ bool mask(const kiln::VariantParams&, const kiln::VariantCoords& at) {
    return at.key % 2 == 0;
  }
};)";
  fs::create_directories(cli.dir() / "variants");
  write_file(cli.dir() / "variants" / "even.cuh", code);
  const std::string spec =
      "attention/prefill/forward_tma.cuh:kiln::attention_forward_tma<band=false,block_m=128,"
      "block_n=128,dtype_kv=bf16,dtype_out=bf16,dtype_q=bf16,has_alibi=false,has_bias=false,"
      "has_softcap=false,head_dim=64,head_dim_v=64,stages=2,varlen=false>(kiln::"
      "AttentionTmaParams) {variant even " +
      kiln::variant_hash(code) + "}";
  // Declared after the spec: refused, naming the line and the fix.
  write_file(cli.dir() / "late.txt", spec + "\nvariant even variants/even.cuh\n");
  const Result late = cli.run({"warm", "--target", "sm_90a", (cli.dir() / "late.txt").string()});
  CHECK(late.code != 0);
  CHECK(contains(late.err, "late.txt:1: kernel spec"));
  CHECK(contains(late.err, "declare it before the spec with a line `variant even FILE`"));
  // The file is relative to the manifest, wherever kiln runs.
  write_file(cli.dir() / "variant.txt", "variant even variants/even.cuh\n" + spec + "\n");
  const Result result =
      cli.run({"warm", "--target", "sm_90a", (cli.dir() / "variant.txt").string()});
  INFO(result.out << result.err);
  CHECK(result.code == 0);
  CHECK(contains(result.out, "compiled 1"));
  CHECK(contains(result.out, "{variant even " + kiln::variant_hash(code) + "}"));
  // kiln compile takes the variant's code the same way, to show its registers and spills.
  const Result compiled = cli.run({"compile", "--target", "sm_90a", spec, "--variant",
                                   "even=" + (cli.dir() / "variants" / "even.cuh").string()});
  INFO(compiled.out << compiled.err);
  CHECK(compiled.code == 0);
  CHECK(contains(compiled.out, "spill"));
  CHECK(contains(compiled.out, "{variant even " + kiln::variant_hash(code) + "}"));
  const Result unnamed = cli.run({"compile", "--target", "sm_90a", spec, "--variant", "even"});
  CHECK(unnamed.code != 0);
  CHECK(contains(unnamed.err, "--variant even must be NAME=FILE"));
  // Code that changed since: refused with both hashes.
  write_file(cli.dir() / "variants" / "even.cuh", code + "\n");
  const Result changed =
      cli.run({"warm", "--target", "sm_90a", (cli.dir() / "variant.txt").string()});
  CHECK(changed.code != 0);
  CHECK(contains(changed.err,
                 "the code declared for even hashes to " + kiln::variant_hash(code + "\n")));
  write_file(cli.dir() / "missing.txt", "variant even variants/odd.cuh\n");
  const Result missing =
      cli.run({"warm", "--target", "sm_90a", (cli.dir() / "missing.txt").string()});
  CHECK(contains(missing.err, "variant even's code file"));
  CHECK(contains(missing.err, "odd.cuh does not exist"));
}

TEST_CASE("kiln warm fails when what it compiled did not stay in the cache", "[cli]") {
  // A cap below one kernel evicts each as it is stored: warming would have been for nothing.
  const Cli cli;
  const Result result = cli.warm_manifest({"KILN_CACHE_MAX_BYTES=1"});
  INFO(result.out << result.err);
  CHECK(result.code == 1);
  CHECK(contains(result.out, "compiled 2"));
  CHECK(contains(result.out, "not stored: elementwise/unary.cuh:kiln::unary<"));
  // Each store evicts all but the newest entry.
  CHECK(contains(result.out, "1 of 2 compiled kernels are not in " + cli.cache().string() +
                                 ": the 1 B cap evicted them"));
  CHECK(cli.entry_files().size() == 1);
}

TEST_CASE("kiln warm refuses a cache directory it cannot use before compiling", "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "file", "not a directory");
  for (const fs::path& unusable : {cli.dir() / "file" / "cache", cli.dir() / "file"}) {
    const Result result = cli.run({"warm", "--target", "sm_90a", "--cache-dir", unusable.string()});
    CHECK(result.code == 1);
    CHECK(contains(result.err, "kiln: error: the cache directory " + unusable.string() +
                                   " cannot be created or written"));
    CHECK_FALSE(contains(result.out, "warmed"));
  }
}

TEST_CASE("kiln warm checks each target once, up front, and suggests the one meant", "[cli]") {
  const Cli cli;
  const Result result = cli.run({"warm", "--target", "sm90"});
  CHECK(result.code == 2);
  CHECK(result.err ==
        "kiln: error: target 'sm90' names no GPU architecture (CUDA targets are sm_XY, such as "
        "sm_80 or sm_90a, HIP ones gfxN, such as gfx90a); did you mean sm_90 or sm_90a?\n");
  CHECK(result.out.empty());

  const Result old = cli.run({"warm", "--target", "SM-80", "--target", "sm_90a"});
  CHECK(old.code == 2);
  CHECK(contains(old.err, "target 'SM-80' names no GPU architecture"));
  CHECK(contains(old.err, "; did you mean sm_80?\n"));

  const Result refused = cli.run({"warm", "--target", "sm_91"});
  CHECK(refused.code == 1);
  CHECK(std::regex_search(refused.err,
                          std::regex("^kiln: error: target 'sm_91' is not one nvrtc [0-9.]+ can "
                                     "build for: use one of [^\n]*sm_90a[^\n]*\n$")));
  CHECK(refused.out.empty());
  CHECK(cli.entry_files().empty());
}

TEST_CASE("kiln warm compiles each spec once however often it is asked for", "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "twice.txt", std::string(kManifest) + kManifest);
  const Result result =
      cli.run({"warm", "--target", "sm_90a", "--target", "sm_90a", "--report",
               (cli.dir() / "report.json").string(), (cli.dir() / "twice.txt").string()});
  INFO(result.out << result.err);
  CHECK(result.code == 0);
  CHECK(contains(result.out, "warmed 2 kernels in "));
  CHECK(contains(result.out, " (6 duplicate specs skipped)\n"));
  CHECK(nlohmann::json::parse(read_file(cli.dir() / "report.json"))["items"].size() == 2);
}

TEST_CASE("kiln warm --list prints the manifest it would compile, which warm then reads", "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "manifest.txt", kManifest);
  const Result listed = cli.run({"warm", "--list", "--target", "sm_90a", "--target", "sm_80",
                                 (cli.dir() / "manifest.txt").string()});
  INFO(listed.out << listed.err);
  REQUIRE(listed.code == 0);
  CHECK(listed.out ==
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
        "(kiln::UnaryParams) @sm_90a\n"
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=5>"
        "(kiln::UnaryParams) @sm_90a\n"
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=4>"
        "(kiln::UnaryParams) @sm_80\n"
        "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=5>"
        "(kiln::UnaryParams) @sm_80\n");
  CHECK(listed.err.empty());
  CHECK((!fs::exists(cli.cache()) || cli.entry_files().empty()));

  // The default set, for a target given by the environment.
  const Result defaults = cli.run({"warm", "--list"}, {"KILN_TARGET=sm_90a"});
  REQUIRE(defaults.code == 0);
  CHECK(contains(defaults.out, "attention/prefill/forward_tma.cuh:kiln::attention_forward_tma<"));
  CHECK(contains(defaults.out, "attention/decode/merge.cuh:kiln::merge_states_kernel<"));

  write_file(cli.dir() / "listed.txt", listed.out);
  const Result warmed = cli.run({"warm", (cli.dir() / "listed.txt").string()});
  CHECK(warmed.code == 0);
  CHECK(contains(warmed.out, "compiled 4"));
}

// The lines of `text` that start with `prefix`.
std::size_t lines_starting(const std::string& text, std::string_view prefix) {
  std::istringstream lines(text);
  std::size_t count = 0;
  for (std::string line; std::getline(lines, line);) count += line.starts_with(prefix) ? 1 : 0;
  return count;
}

TEST_CASE("kiln warm's default set is attention and decode, and --elementwise adds the rest",
          "[cli]") {
  const Cli cli;
  const Result defaults = cli.run({"warm", "--list", "--target", "sm_90a"});
  INFO(defaults.out << defaults.err);
  REQUIRE(defaults.code == 0);
  CHECK(lines_starting(defaults.out, "attention/") > 0);
  CHECK(lines_starting(defaults.out, "elementwise/") == 0);

  const Result all = cli.run({"warm", "--list", "--elementwise", "--target", "sm_90a"});
  INFO(all.out << all.err);
  REQUIRE(all.code == 0);
  CHECK(lines_starting(all.out, "elementwise/") == kiln::unary_default_specs().size());
  CHECK(all.out.starts_with(defaults.out));

  // A target that no default kernel runs on is refused, not warmed with nothing.
  const Result none = cli.run({"warm", "--list", "--target", "gfx1100"});
  CHECK(none.code == 1);
  CHECK(contains(none.err, "no default kernel runs on gfx1100"));

  // A manifest says what to compile: --elementwise with one is refused, not ignored.
  write_file(cli.dir() / "manifest.txt", kManifest);
  const Result refused = cli.run(
      {"warm", "--elementwise", "--target", "sm_90a", (cli.dir() / "manifest.txt").string()});
  CHECK(refused.code != 0);
  CHECK(contains(refused.err, "manifest excludes --elementwise"));
}

// The specs of `text`: each line's from its first word that parses as one ("[1/2] compiled 210 ms
// SPEC", "failed: SPEC"), or a table row's last column.
std::vector<std::string> specs_in(const std::string& text) {
  static const std::regex spec_word("[^ \n]+\\.cuh:[^ \n]+\\)( \\[[^]\n]*\\])? @[^ \n]+");
  std::vector<std::string> specs;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), spec_word);
       it != std::sregex_iterator(); ++it) {
    specs.push_back(it->str());
  }
  return specs;
}

TEST_CASE("every spec kiln warm prints reads back as that spec, for kiln compile", "[cli]") {
  const Cli cli;
  const Result result = cli.warm_manifest();
  REQUIRE(result.code == 0);
  // stderr is a file: one line per item, with its whole spec.
  CHECK(std::regex_search(
      result.err,
      std::regex("\\[1/2\\] compiled +[0-9.]+ m?s  elementwise/unary\\.cuh:kiln::unary<"
                 "block_size=256,dtype=f32,items_per_thread=4,op=[45]>\\(kiln::UnaryParams\\) "
                 "@sm_90a\n")));
  const std::vector<std::string> printed = specs_in(result.err + result.out);
  CHECK(printed.size() == 4);  // two progress lines, two rows of the slowest
  for (const std::string& spec : printed) {
    INFO(spec);
    CHECK(to_string(parse_spec(spec)) == spec);
    const Result compiled = cli.run({"compile", spec});
    CHECK(compiled.code == 0);
    CHECK(contains(compiled.out, "\nfrom          the disk cache\n"));
  }
}

TEST_CASE("kiln warm's progress bar names the kernel, its constants by name and its target",
          "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "manifest.txt", kManifest);
  const Result result =
      run_kiln_on_terminal(cli.dir(), cli.cache(),
                           {"warm", "--target", "sm_90a", (cli.dir() / "manifest.txt").string()});
  INFO(result.out << result.err);
  REQUIRE(result.code == 0);
  CHECK(std::regex_search(
      result.err, std::regex("\\] [12]/2  unary block_size=256 dtype=f32 items_per_thread=4 "
                             "op=(sin|cos) @sm_90a [0-9.]+ m?s")));
  CHECK_FALSE(contains(result.err, "op=4"));
}

TEST_CASE("kiln compile refuses an op out of range as a schema error, naming the ops", "[cli]") {
  const Cli cli;
  const Result result = cli.run(
      {"compile",
       "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,items_per_thread=4,op=42>"
       "(kiln::UnaryParams) @sm_90a"});
  CHECK(result.code == 2);
  CHECK(contains(result.err, "constant op is 42: it must be one of 0 (neg), 1 (abs)"));
  CHECK(contains(result.err, "11 (sqrt)"));
  CHECK_FALSE(contains(result.err, "static_assert"));
  CHECK(cli.entry_files().empty());
}

TEST_CASE("kiln warm --threads takes a count, or 0 for one per hardware thread", "[cli]") {
  const Cli cli;
  write_file(cli.dir() / "manifest.txt", kManifest);
  const Result zero = cli.run({"warm", "--quiet", "--threads", "0", "--target", "sm_90a",
                               (cli.dir() / "manifest.txt").string()});
  CHECK(zero.code == 0);
  for (const char* bad : {"-1", "abc", "1.5", "99999999999"}) {
    const Result result = cli.run({"warm", "--threads", bad, "--target", "sm_90a"});
    CHECK(result.code == 2);
    CHECK(contains(result.err, fmt::format("'{}' is not a thread count: give a whole number "
                                           "from 1 to 2147483647, or 0 for one per hardware "
                                           "thread",
                                           bad)));
  }
}

TEST_CASE("kiln names an unknown command and the one meant", "[cli]") {
  const Cli cli;
  const Result infos = cli.run({"infos"});
  CHECK(infos.code == 2);
  CHECK(contains(infos.err, "kiln: error: unknown command 'infos'; did you mean 'info'?\n"));
  const Result lss = cli.run({"cache", "lss", "--json"});
  CHECK(lss.code == 2);
  CHECK(contains(lss.err, "kiln: error: unknown command 'cache lss'; did you mean 'cache ls'?\n"));
  const Result comp = cli.run({"comp", kSpec});
  CHECK(contains(comp.err, "unknown command 'comp'; did you mean 'compile'?"));
  const Result far = cli.run({"frobnicate"});
  CHECK(far.code == 2);
  CHECK(contains(far.err,
                 "kiln: error: unknown command 'frobnicate': the commands are info, warm, compile, "
                 "cache, help\n"));
  // Below a command, words are its own: a manifest may be called "infos".
  CHECK_FALSE(contains(cli.run({"warm", "--target", "sm_90a", "infos"}).err, "unknown command"));
}

TEST_CASE("kiln compile says where the binary came from and its dynamic shared memory", "[cli]") {
  const Cli cli;
  const Result first = cli.run({"compile", kSpec});
  INFO(first.out << first.err);
  REQUIRE(first.code == 0);
  CHECK(contains(first.out, "\nfrom          a fresh compile\n"));
  CHECK(contains(first.out, "\ndynamic smem  0 bytes at launch\n"));
  const Result second = cli.run({"compile", kSpec});
  CHECK(contains(second.out, "\nfrom          the disk cache\n"));
}

TEST_CASE("kiln compile refuses a spec with missing or unknown constants, naming them", "[cli]") {
  const Cli cli;
  const Result missing = cli.run(
      {"compile", "elementwise/unary.cuh:kiln::unary<dtype=f32,op=4>(kiln::UnaryParams) @sm_90a"});
  CHECK(missing.code == 2);
  CHECK(contains(missing.err, "it lacks the constants block_size, items_per_thread"));
  const Result unknown =
      cli.run({"compile",
               "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f32,fast=true,"
               "items_per_thread=4,op=4>(kiln::UnaryParams) @sm_90a"});
  CHECK(unknown.code == 2);
  CHECK(contains(unknown.err, "kiln::unary does not take the constants fast"));
  CHECK(cli.entry_files().empty());
}

TEST_CASE("kiln info shows the cache cap and the KILN_* variables set", "[cli]") {
  const Cli cli;
  const Result plain = cli.run({"info"});
  INFO(plain.out << plain.err);
  REQUIRE(plain.code == 0);
  CHECK(std::regex_search(plain.out,
                          std::regex("\ncache cap +none \\(KILN_CACHE_MAX_BYTES sets one\\)\n")));
  CHECK(std::regex_search(
      plain.out, std::regex("\nenvironment +KILN_CACHE_DIR=" + cli.cache().string() + "\n")));

  const Result set = cli.run({"info"}, {"KILN_CACHE_MAX_BYTES=512m", "KILN_LOG=error"});
  REQUIRE(set.code == 0);
  CHECK(std::regex_search(set.out, std::regex("\ncache cap +512\\.0 MiB\n")));
  CHECK(contains(set.out, "KILN_CACHE_MAX_BYTES=512m\n"));
  CHECK(contains(set.out, "KILN_LOG=error\n"));

  const Result json = cli.run({"info", "--json"}, {"KILN_CACHE_MAX_BYTES=1.5G"});
  REQUIRE(json.code == 0);
  const auto parsed = nlohmann::json::parse(json.out);
  CHECK(parsed["cache"]["max_bytes"] == 3ull << 29);
  CHECK(parsed["environment"]["KILN_CACHE_MAX_BYTES"] == "1.5G");
  CHECK(parsed["environment"]["KILN_CACHE_DIR"] == cli.cache().string());
}

TEST_CASE("kiln exits 2 on usage errors and prints its version", "[cli]") {
  const Cli cli;
  CHECK(cli.run({"frobnicate"}).code == 2);
  // CLI11 2.1.2 spun forever on these, taking "" for its nameless option group.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"info", "", "--fix"}, {"info", ""}, {"warm", "", "--fix"}}) {
    const Result empty = cli.run(args);
    CHECK(empty.code == 2);
    CHECK(contains(empty.err, "is empty"));
  }
  CHECK(cli.run({"info", "--target", "sm_90a", "--target", "gfx90a"}).code == 2);
  const Result jit = cli.run({"info", "--jit", "sometimes"});
  CHECK(jit.code == 2);
  CHECK(contains(jit.err, "kiln: error: --jit is 'sometimes': expected on, strict or off"));
  const Result version = cli.run({"--version"});
  CHECK(version.code == 0);
  CHECK(std::regex_search(version.out,
                          std::regex("^kiln [0-9]+\\.[0-9]+\\.[0-9]+ \\(libkiln built from " +
                                     std::string(kiln_build_id()) + "\\)\n")));
}

TEST_CASE("kiln help, bare kiln and bare kiln cache print the usage and the commands", "[cli]") {
  const Cli cli;
  const Result help = cli.run({"help"});
  CHECK(help.code == 0);
  CHECK(help.err.empty());
  CHECK(contains(help.out, "Usage: kiln [OPTIONS] [COMMAND]"));
  for (const char* command : {"info", "warm", "compile", "cache", "help"}) {
    CHECK(std::regex_search(help.out, std::regex(fmt::format("\n  {} +[A-Z]", command))));
  }
  const Result bare = cli.run({});
  CHECK(bare.code == 1);
  CHECK(bare.out == help.out);

  const Result cache = cli.run({"cache"});
  CHECK(cache.code == 1);
  CHECK(contains(cache.out, "Usage: kiln cache [OPTIONS] [COMMAND]"));
  for (const char* command : {"ls", "stats", "verify", "prune", "clear"}) {
    CHECK(std::regex_search(cache.out, std::regex(fmt::format("\n  {} +[A-Z]", command))));
  }
  CHECK(cli.run({"help", "cache"}).out == cache.out);

  const Result ls = cli.run({"help", "cache", "ls"});
  CHECK(ls.code == 0);
  CHECK(contains(ls.out, "Usage: kiln cache ls [OPTIONS]"));
  CHECK(ls.out == cli.run({"cache", "ls", "--help"}).out);

  const Result typo = cli.run({"help", "cache", "lss"});
  CHECK(typo.code == 2);
  CHECK(contains(typo.err, "unknown command 'cache lss'; did you mean 'cache ls'?"));
  CHECK_FALSE(fs::exists(cli.cache()));
}

TEST_CASE("each kiln command lists only the options that mean something to it", "[cli]") {
  const Cli cli;
  for (const char* command : {"ls", "stats", "verify", "prune", "clear"}) {
    CAPTURE(command);
    const Result help = cli.run({"cache", command, "--help"});
    CHECK(help.code == 0);
    CHECK(contains(help.out, "--cache-dir"));
    CHECK(contains(help.out, "--log"));
    for (const char* unrelated : {"--target", "--kernels-dir", "--backend", "--jit"}) {
      CHECK_FALSE(contains(help.out, unrelated));
    }
    CHECK(cli.run({"cache", command, "--target", "sm_90a"}).code == 2);
  }
  for (const char* command : {"info", "warm", "compile"}) {
    CAPTURE(command);
    const Result help = cli.run({command, "--help"});
    for (const char* option : {"--cache-dir", "--log", "--target", "--kernels-dir", "--jit"}) {
      CHECK(contains(help.out, option));
    }
  }
}

TEST_CASE("kiln cache ls sorts by spec or by size, and calls no lock file a leftover", "[cli]") {
  const Cli cli;
  cli.warm();
  // A third entry, larger than the others: the same op for f64.
  const std::string f64 =
      "elementwise/unary.cuh:kiln::unary<block_size=256,dtype=f64,items_per_thread=4,op=0>"
      "(kiln::UnaryParams) @sm_90a";
  REQUIRE(cli.run({"compile", f64}).code == 0);
  const Result by_name = cli.run({"cache", "ls"});
  REQUIRE(by_name.code == 0);
  std::vector<std::string> specs = specs_in(by_name.out);
  REQUIRE(specs.size() == 3);
  CHECK(std::is_sorted(specs.begin(), specs.end()));
  CHECK_FALSE(contains(by_name.out, "lock file"));

  const Result json = cli.run({"cache", "ls", "--json", "--sort", "size"});
  REQUIRE(json.code == 0);
  std::vector<std::uint64_t> sizes;
  for (const auto& entry : nlohmann::json::parse(json.out)) sizes.push_back(entry["size"]);
  REQUIRE(sizes.size() == 3);
  CHECK(std::is_sorted(sizes.rbegin(), sizes.rend()));

  const Result bad = cli.run({"cache", "ls", "--sort", "hash"});
  CHECK(bad.code == 2);
  CHECK(contains(bad.err, "--sort"));
}

TEST_CASE("kiln cache stats counts hits, misses and compile time over every process", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result first = cli.run({"cache", "stats"});
  INFO(first.out << first.err);
  REQUIRE(first.code == 0);
  CHECK(std::regex_search(first.out, std::regex("\nhits +0 \\(saved 0 ms of compiling\\)\n")));
  CHECK(std::regex_search(
      first.out, std::regex("\nmisses +2 \\(2 compiled, 0 failed; [0-9.]+ m?s compiling\\)\n")));
  CHECK(std::regex_search(first.out, std::regex("\nhit rate +0\\.0 %\n")));
  CHECK(std::regex_search(first.out, std::regex("\nentries +2, ")));

  // Another process finds both on disk: two hits, which saved what compiling them took.
  cli.warm();
  const Result second = cli.run({"cache", "stats"});
  CHECK(std::regex_search(second.out,
                          std::regex("\nhits +2 \\(saved [0-9.]+ m?s of compiling\\)\n")));
  CHECK(std::regex_search(second.out, std::regex("\nhit rate +50\\.0 %\n")));

  CHECK(cli.run({"cache", "stats", "--zero"}).code == 0);
  CHECK(std::regex_search(cli.run({"cache", "stats"}).out, std::regex("\nhit rate +none yet\n")));
}

}  // namespace
}  // namespace kiln::test
