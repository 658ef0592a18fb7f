// Tests of the `kiln` command, run as a subprocess against a private cache directory.
#include <sys/stat.h>

#include <algorithm>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli/run_kiln.hpp"
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

// The built `kiln` with a scratch directory whose cache/ is its only cache, and no KILN_*
// variable of the calling environment.
class Cli {
 public:
  const fs::path& dir() const { return scratch_.path(); }
  fs::path cache() const { return scratch_.path() / "cache"; }

  Result run(const std::vector<std::string>& args) const { return run_kiln(dir(), cache(), args); }

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

TEST_CASE("kiln info names the cache directory and the JIT mode", "[cli]") {
  const Cli cli;
  const Result result = cli.run({"info", "--jit", "strict"});
  INFO(result.out << result.err);
  CHECK(result.code == 0);
  CHECK(contains(result.out, cli.cache().string() + " (0 entries, 0 B)"));
  CHECK(std::regex_search(result.out, std::regex("\njit +strict\n")));
}

TEST_CASE("kiln info --json reports backends, target, sources and cache", "[cli]") {
  const Cli cli;
  cli.warm();
  const Result result = cli.run({"info", "--json", "--target", "gfx90a"});
  INFO(result.out << result.err);
  REQUIRE(result.code == 0);
  const auto json = nlohmann::json::parse(result.out);
  for (const char* key : {"version", "backend", "backends", "target", "target_problem",
                          "kernels_dir", "cache", "jit"}) {
    CHECK(json.contains(key));
  }
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
  write_file(manifest, "elementwise/missing.cuh:kiln::unary<op=4>(kiln::UnaryParams)\n");
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
  const Cli cli;
  const Result info = cli.run({"info", "--json"});
  REQUIRE(info.code == 0);
  const auto backends = nlohmann::json::parse(info.out)["backends"];
  if (std::none_of(backends.begin(), backends.end(), [](const nlohmann::json& backend) {
        return backend["name"] == "hip" && backend["compiler_found"] == true;
      })) {
    WARN("skipped: needs hipRTC");
    return;
  }
  // hipRTC of ROCm 5.2 aborted the process in comgr for each of these.
  for (const char* target : {"gfx942", "gfx1100", "gfx9999"}) {
    const Result result = cli.run({"warm", "--quiet", "--target", target});
    CHECK(result.code == 1);
    CHECK(contains(result.out, "target '" + std::string(target) + "' is not one hiprtc"));
    CHECK(contains(result.out, "gfx90a"));
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
  const Result result =
      cli.run({"compile", "elementwise/missing.cuh:kiln::unary<op=4>(kiln::UnaryParams) @sm_90a"});
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
  CHECK(cli.run({"warm", "--threads", "0"}).code == 2);
  CHECK(cli.run({"info", "--target", "sm_90a", "--target", "gfx90a"}).code == 2);
  const Result jit = cli.run({"info", "--jit", "sometimes"});
  CHECK(jit.code == 2);
  CHECK(contains(jit.err, "kiln: error: --jit is 'sometimes': expected on, strict or off"));
  const Result version = cli.run({"--version"});
  CHECK(version.code == 0);
  CHECK(std::regex_search(version.out, std::regex("^kiln [0-9]+\\.[0-9]+\\.[0-9]+\n")));
}

}  // namespace
}  // namespace kiln::test
