// SPDX-License-Identifier: Apache-2.0
// The compiler fact memo through the runtime: keys from a warm memo load no compiler, and a memo
// that is stale, corrupt or wrong is never trusted to file a binary. Also the disk cache's notes,
// where the memo is kept.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "backend/compiler_library.hpp"
#include "cache/disk.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using kiln::detail::compiler_library_opens;

kiln::KernelSpec unary(int op) {
  return kiln::unary_spec(static_cast<kiln::UnaryOp>(op), kiln::DType::f32, {256, 4});
}

kiln::Options options_for(const fs::path& cache, std::string target = "sm_90a") {
  return kiln::test::isolated_options(cache, std::move(target));
}

fs::path memo_file(const fs::path& cache, std::string_view vendor = "cuda") {
  return cache / "v1" / "compilers" / (std::string(vendor) + ".json");
}

json read_memo(const fs::path& cache) {
  return json::parse(kiln::test::read_file(memo_file(cache)));
}

void edit_memo(const fs::path& cache, const std::function<void(json&)>& edit) {
  json memo = read_memo(cache);
  edit(memo);
  kiln::test::write_file(memo_file(cache), memo.dump());
}

// Runs `body` in a forked child, a fresh process as far as the runtime is concerned; returns its
// exit code.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 100;
    try {
      code = body();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST_CASE("a new process keys a disk hit from the compiler memo without loading NVRTC",
          "[runtime]") {
  kiln::test::TempDir dir;
  const kiln::KernelInfo first = kiln::Runtime(options_for(dir.path())).compile(unary(4));
  REQUIRE(fs::exists(memo_file(dir.path())));
  CHECK(read_memo(dir.path())["identity"] == first.compiler);

  // Exit codes: 1 another key, 2 NVRTC loaded for the key, 3 not a disk hit, 4 loaded for the hit.
  const int code = in_child([&] {
    const std::uint64_t opens = compiler_library_opens();
    kiln::Runtime rt(options_for(dir.path()));
    if (rt.key(unary(4)) != first.key) return 1;
    if (compiler_library_opens() != opens) return 2;
    const kiln::KernelInfo again = rt.compile(unary(4));
    if (again.key != first.key || rt.stats().disk_hits != 1 || rt.stats().compiles != 0) return 3;
    return compiler_library_opens() == opens ? 0 : 4;
  });
  CHECK(code == 0);
}

TEST_CASE("a memo whose library file changed is not trusted, and is rewritten", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string key = kiln::Runtime(options_for(dir.path())).key(unary(4));
  const json before = read_memo(dir.path());
  SECTION("its size") {
    edit_memo(dir.path(), [](json& m) {
      m["library"]["size"] = m["library"]["size"].get<std::uint64_t>() + 1;
    });
  }
  SECTION("its modification time") {
    edit_memo(dir.path(), [](json& m) {
      m["library"]["mtime_ns"] = m["library"]["mtime_ns"].get<std::int64_t>() - 1;
    });
  }
  std::uint64_t opens = compiler_library_opens();
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == key);
  CHECK(compiler_library_opens() == ++opens);
  CHECK(read_memo(dir.path()) == before);
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == key);
  CHECK(compiler_library_opens() == opens);
}

TEST_CASE("a corrupt memo is ignored and rewritten", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string key = kiln::Runtime(options_for(dir.path())).key(unary(4));
  const json before = read_memo(dir.path());
  const auto text = GENERATE(as<std::string>{}, "", "{ \"memo\": 1, \"ident", "[1, 2, 3]",
                             "{\"memo\": 1, \"identity\": 7}");
  INFO(text);
  kiln::test::write_file(memo_file(dir.path()), text);
  const std::uint64_t opens = compiler_library_opens();
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == key);
  CHECK(compiler_library_opens() == opens + 1);
  CHECK(read_memo(dir.path()) == before);
}

TEST_CASE("a memo naming another compiler is corrected before anything is stored", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string real = kiln::Runtime(options_for(dir.path())).compile(unary(4)).compiler;
  edit_memo(dir.path(), [](json& m) { m["identity"] = "nvrtc 0.1"; });

  kiln::Runtime rt(options_for(dir.path()));
  const std::uint64_t opens = compiler_library_opens();
  const std::string stale_key = rt.key(unary(5));
  CHECK(compiler_library_opens() == opens);  // the memo looks current, so it is believed

  const kiln::KernelInfo info = rt.compile(unary(5));
  CHECK(info.compiler == real);
  CHECK(info.key != stale_key);
  CHECK(read_memo(dir.path())["identity"] == real);
  CHECK(rt.key(unary(5)) == info.key);
  kiln::Runtime fresh(options_for(dir.path()));
  CHECK(fresh.key(unary(5)) == info.key);
  CHECK(fresh.compile(unary(5)).key == info.key);
  CHECK(fresh.stats().disk_hits == 1);
  kiln::detail::DiskCache disk({dir.path(), {}, 0});
  for (const auto& entry : disk.list(true)) {
    CHECK(entry.key->hex() != stale_key);
    CHECK(entry.meta->compiler == real);
  }
}

TEST_CASE("a target the memo has not seen is asked of the compiler and added", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string sm90 = kiln::Runtime(options_for(dir.path())).key(unary(4));
  std::uint64_t opens = compiler_library_opens();
  const std::string sm80 = kiln::Runtime(options_for(dir.path(), "sm_80")).key(unary(4));
  CHECK(compiler_library_opens() == ++opens);
  CHECK(read_memo(dir.path())["targets"].contains("sm_80"));
  CHECK(kiln::Runtime(options_for(dir.path(), "sm_80")).key(unary(4)) == sm80);
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == sm90);
  CHECK(compiler_library_opens() == opens);
}

TEST_CASE("another CUDA_HOME is another loader signature", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string key = kiln::Runtime(options_for(dir.path())).key(unary(4));
  const kiln::test::ScopedEnv home("CUDA_HOME", (dir.path() / "no-toolkit").c_str());
  std::uint64_t opens = compiler_library_opens();
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == key);  // NVRTC found elsewhere
  CHECK(compiler_library_opens() == ++opens);
  CHECK(read_memo(dir.path())["loader"]["candidates"][0].get<std::string>().starts_with(
      (dir.path() / "no-toolkit").string()));
  CHECK(kiln::Runtime(options_for(dir.path())).key(unary(4)) == key);
  CHECK(compiler_library_opens() == opens);
}

TEST_CASE("hipRTC keys come from its own memo too", "[runtime]") {
  KILN_REQUIRE_HIPRTC();
  kiln::test::TempDir dir;
  const kiln::KernelInfo first = kiln::Runtime(options_for(dir.path(), "gfx90a")).compile(unary(9));
  CHECK_THAT(json::parse(kiln::test::read_file(memo_file(dir.path(), "hip")))["identity"]
                 .get<std::string>(),
             Catch::StartsWith("hiprtc "));
  const std::uint64_t opens = compiler_library_opens();
  kiln::Runtime rt(options_for(dir.path(), "gfx90a"));
  CHECK(rt.key(unary(9)) == first.key);
  CHECK(compiler_library_opens() == opens);
}

TEST_CASE("a memory-only cache keeps no memo and still compiles", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::test::write_file(dir.path() / "file", "not a directory");
  const auto options = options_for(dir.path() / "file" / "cache");
  std::uint64_t opens = compiler_library_opens();
  kiln::Runtime first(options);
  const std::string key = first.key(unary(4));
  CHECK(compiler_library_opens() == ++opens);
  CHECK(first.compile(unary(4)).key == key);
  kiln::Runtime second(options);
  CHECK(second.key(unary(4)) == key);
  CHECK(compiler_library_opens() == ++opens);
}

TEST_CASE("cache notes are published under the writable tier and read back", "[cache]") {
  kiln::test::TempDir dir;
  kiln::detail::DiskCache disk({dir.path(), {}, 0});
  CHECK_FALSE(disk.read_note("compilers/cuda.json"));
  disk.write_note("compilers/cuda.json", "first");
  disk.write_note("compilers/cuda.json", "second");
  CHECK(disk.read_note("compilers/cuda.json") == "second");
  CHECK(kiln::test::read_file(dir.path() / "v1" / "compilers" / "cuda.json") == "second");
  struct stat info {};
  REQUIRE(::stat((dir.path() / "v1" / "compilers").c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0700);
  CHECK(std::distance(fs::directory_iterator(dir.path() / "v1" / "compilers"),
                      fs::directory_iterator()) == 1);  // no temp file left behind

  kiln::test::write_file(dir.path() / "v1" / "compilers" / "big.json",
                         std::string((1 << 20) + 1, ' '));
  CHECK_FALSE(disk.read_note("compilers/big.json"));
  for (const char* bad : {"", "/abs", "a//b", "../escape", "compilers/..", "a b", "x.tmp"}) {
    INFO(bad);
    CHECK_THROWS_AS(disk.read_note(bad), kiln::Error);
    CHECK_THROWS_AS(disk.write_note(bad, "x"), kiln::Error);
  }
}

TEST_CASE("cache notes are never read or written through a symbolic link", "[cache]") {
  kiln::test::TempDir dir;
  kiln::test::TempDir elsewhere;
  kiln::test::write_file(elsewhere.path() / "cuda.json", "planted");
  {
    kiln::detail::DiskCache disk({dir.path(), {}, 0});
    fs::create_directory_symlink(elsewhere.path(), dir.path() / "v1" / "compilers");
    CHECK_FALSE(disk.read_note("compilers/cuda.json"));
    disk.write_note("compilers/cuda.json", "written");
    CHECK(kiln::test::read_file(elsewhere.path() / "cuda.json") == "planted");
    fs::remove(dir.path() / "v1" / "compilers");
    fs::create_directory(dir.path() / "v1" / "compilers");
    fs::create_symlink(elsewhere.path() / "cuda.json",
                       dir.path() / "v1" / "compilers" / "cuda.json");
    CHECK_FALSE(disk.read_note("compilers/cuda.json"));
  }
  kiln::detail::DiskCache memory_only({std::nullopt, {}, 0});
  CHECK_FALSE(memory_only.read_note("compilers/cuda.json"));
  memory_only.write_note("compilers/cuda.json", "nowhere");  // a no-op, not an error
}

}  // namespace
