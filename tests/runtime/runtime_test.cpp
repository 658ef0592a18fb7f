// SPDX-License-Identifier: Apache-2.0
// The runtime without a GPU: compile for an explicit target, disk hits, recovery, JIT modes,
// single-flight, many processes, warm-up, dumps and compile errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <thread>

#include "cache/disk.hpp"
#include "cache/stats.hpp"
#include "kiln/elementwise.hpp"
#include "kiln/error.hpp"
#include "kiln/runtime.hpp"
#include "runtime/device_calls.hpp"
#include "runtime/processes.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;

kiln::KernelSpec unary(int op, kiln::DType dtype = kiln::DType::f32, int block = 256) {
  return kiln::unary_spec(static_cast<kiln::UnaryOp>(op), dtype, {block, 4});
}

kiln::Options options_for(const fs::path& cache, std::string target = "sm_90a") {
  return kiln::test::isolated_options(cache, std::move(target));
}

std::vector<kiln::detail::EntryStatus> entries(const fs::path& cache) {
  kiln::detail::DiskCache disk({cache, {}, 0});
  return disk.list(true);
}

}  // namespace

TEST_CASE("compile misses, then a new runtime hits the disk", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::KernelInfo first;
  {
    kiln::Runtime rt(options_for(dir.path()));
    first = rt.compile(unary(4));
    CHECK(rt.stats().compiles == 1);
    CHECK(rt.stats().disk_hits == 0);
    CHECK(first.registers > 0);
    CHECK(first.compile_ms > 0);
    CHECK(first.target == "sm_90a");
    CHECK_THAT(first.compiler, Catch::StartsWith("nvrtc "));
    CHECK_FALSE(first.lowered_name.empty());
    rt.compile(unary(4));
    CHECK(rt.stats().compiles == 1);
  }
  kiln::Runtime rt(options_for(dir.path()));
  const kiln::KernelInfo again = rt.compile(unary(4));
  CHECK(rt.stats().compiles == 0);
  CHECK(rt.stats().disk_hits == 1);
  CHECK(again.key == first.key);
  CHECK(again.lowered_name == first.lowered_name);
  CHECK(again.registers == first.registers);
  const auto listed = entries(dir.path());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].valid);
  CHECK(listed[0].key->hex() == first.key);
}

TEST_CASE("a corrupt entry is rebuilt, never trusted", "[runtime]") {
  kiln::test::TempDir dir;
  const std::string key = kiln::Runtime(options_for(dir.path())).compile(unary(2)).key;
  auto listed = entries(dir.path());
  REQUIRE(listed.size() == 1);
  std::string bytes = kiln::test::read_file(listed[0].path);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  kiln::test::write_file(listed[0].path, bytes);

  kiln::Runtime rt(options_for(dir.path()));
  CHECK(rt.compile(unary(2)).key == key);
  CHECK(rt.stats().compiles == 1);
  listed = entries(dir.path());
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].valid);
}

TEST_CASE("an unwritable cache root means memory-only, and compiles still work", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::test::write_file(dir.path() / "file", "not a directory");
  kiln::Runtime rt(options_for(dir.path() / "file" / "cache"));
  CHECK(rt.info().cache_dir.empty());
  CHECK(rt.compile(unary(1)).registers > 0);
  CHECK(rt.compile(unary(1)).registers > 0);
  CHECK(rt.stats().compiles == 1);
}

TEST_CASE("KILN_JIT=off refuses to compile, and strict still compiles off the hot path",
          "[runtime]") {
  kiln::test::TempDir dir;
  auto options = options_for(dir.path());
  options.jit = kiln::JitMode::off;
  try {
    kiln::Runtime(options).compile(unary(3));
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK(e.category() == kiln::ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("KILN_JIT=off"));
  }
  options.jit = kiln::JitMode::strict;
  CHECK(kiln::Runtime(options).compile(unary(3)).registers > 0);
  options.jit = kiln::JitMode::off;
  kiln::Runtime off(options);
  CHECK(off.compile(unary(3)).registers > 0);  // a disk hit needs no compiler run
  CHECK(off.stats().disk_hits == 1);
}

TEST_CASE("environment variables are read, and malformed ones named", "[runtime]") {
  kiln::test::TempDir dir;
  {
    kiln::test::ScopedEnv cache("KILN_CACHE_DIR", dir.path().c_str());
    kiln::test::ScopedEnv target("KILN_TARGET", "sm_80");
    kiln::Runtime rt;
    CHECK(rt.info().cache_dir == dir.path());
    CHECK(rt.target() == "sm_80");
  }
  kiln::test::ScopedEnv jit("KILN_JIT", "sometimes");
  try {
    kiln::Runtime rt;
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("KILN_JIT") && Catch::Contains("sometimes"));
  }
}

TEST_CASE("KILN_DEBUG turns the debug checks on, Options::debug wins, bad values are named",
          "[runtime]") {
  kiln::test::TempDir dir;
  kiln::Options options = options_for(dir.path());
  {
    kiln::test::ScopedEnv unset("KILN_DEBUG", nullptr);
    CHECK_FALSE(kiln::detail::debug(kiln::Runtime(options)));
  }
  for (const char* on : {"1", "true", "on"}) {
    kiln::test::ScopedEnv debug("KILN_DEBUG", on);
    CHECK(kiln::detail::debug(kiln::Runtime(options)));
  }
  for (const char* off : {"0", "false", "off"}) {
    kiln::test::ScopedEnv debug("KILN_DEBUG", off);
    CHECK_FALSE(kiln::detail::debug(kiln::Runtime(options)));
  }
  kiln::test::ScopedEnv debug("KILN_DEBUG", "yes");
  options.debug = false;  // the option wins, so the variable is not even read
  CHECK_FALSE(kiln::detail::debug(kiln::Runtime(options)));
  options.debug.reset();
  try {
    kiln::Runtime rt(options);
    FAIL("no error");
  } catch (const kiln::Error& e) {
    CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
    CHECK_THAT(e.what(),
               Catch::Contains("KILN_DEBUG is 'yes'") && Catch::Contains("1, true or on"));
  }
}

TEST_CASE("device memory and device properties need the runtime's device, and say so",
          "[runtime]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  CHECK(kiln::detail::allocate_async(rt, 0, nullptr) == nullptr);  // nothing asked, nothing needed
  CHECK_NOTHROW(kiln::detail::free_async(rt, nullptr, nullptr));
  if (kiln::test::gpu_unavailable_reason()) {
    const auto refused = [](const std::function<void()>& call, const char* doing) {
      try {
        call();
        FAIL("no error");
      } catch (const kiln::Error& e) {
        CHECK(e.category() == kiln::ErrorCategory::not_found);
        CHECK_THAT(e.what(), Catch::Contains(doing));
      }
    };
    refused([&] { rt.device_info(); }, "no cuda device 0");
    refused([&] { kiln::detail::allocate_async(rt, 256, nullptr); },
            "cannot allocate device memory");
    int host = 0;
    refused([&] { kiln::detail::copy_to_host(rt, &host, &host, sizeof host, nullptr); },
            "cannot copy device memory to the host");
    return;
  }
  const kiln::DeviceInfo info = rt.device_info();
  CHECK(info.multiprocessors > 0);
  CHECK(info.ordinal == rt.device());
  // What decode plans for ahead of time, without the device, is what the device gives.
  CHECK(kiln::Target(info.target).max_shared_bytes_per_block() == info.max_shared_bytes_per_block);
  void* scratch = kiln::detail::allocate_async(rt, 4096, nullptr);
  REQUIRE(scratch != nullptr);
  std::array<std::byte, 4096> host{};
  CHECK_NOTHROW(kiln::detail::copy_to_host(rt, host.data(), scratch, host.size(), nullptr));
  CHECK_NOTHROW(kiln::detail::free_async(rt, scratch, nullptr));
}

TEST_CASE("many threads asking for one key compile it once", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  std::vector<std::string> keys(16);
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      threads.emplace_back([&, i] { keys[i] = rt.compile(unary(6)).key; });
    }
  }
  CHECK(rt.stats().compiles == 1);
  for (const std::string& key : keys) CHECK(key == keys[0]);
}

TEST_CASE("different keys compile concurrently", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path()));
  std::atomic<int> done{0};
  {
    std::vector<std::jthread> threads;
    for (int op = 0; op < 4; ++op) {
      threads.emplace_back([&, op] {
        rt.compile(unary(op));
        ++done;
      });
    }
  }
  CHECK(done == 4);
  CHECK(rt.stats().compiles == 4);
  CHECK(entries(dir.path()).size() == 4);
}

TEST_CASE("8 processes compiling the same keys leave one valid entry per key", "[runtime]") {
  kiln::test::TempDir dir;
  const std::vector<kiln::KernelSpec> specs = {unary(7), unary(8), unary(9)};
  kiln::test::in_processes(8, [&](int) {
    kiln::Runtime rt(options_for(dir.path()));
    return std::all_of(specs.begin(), specs.end(), [&](const kiln::KernelSpec& spec) {
      return rt.compile(spec).registers > 0;
    });
  });
  const auto listed = entries(dir.path());
  CHECK(listed.size() == specs.size());
  for (const auto& entry : listed) CHECK(entry.valid);
  std::size_t leftovers = 0;
  for (const auto& file : fs::recursive_directory_iterator(dir.path())) {
    // The compiler fact memo (compilers/cuda.json) and the tally are meant to stay; temp files
    // are not.
    if (file.is_regular_file() && file.path().extension() != ".kbin" &&
        file.path().extension() != ".lock" && file.path().filename() != "stats.log" &&
        file.path().parent_path().filename() != "compilers") {
      ++leftovers;
    }
  }
  CHECK(leftovers == 0);
  // Each process found each key once, compiled or on disk, and the tally lost none of it.
  const kiln::detail::DiskCache cache(kiln::detail::DiskCacheConfig{dir.path()});
  const kiln::detail::CacheTally tally = kiln::detail::read_tally(cache);
  CHECK(tally.compiles + tally.disk_hits == 8 * specs.size());
  CHECK(tally.compiles >= specs.size());
  CHECK(tally.compile_failures == 0);
}

TEST_CASE("warm-up compiles in parallel, reports each item and then hits", "[runtime]") {
  kiln::test::TempDir dir;
  std::vector<kiln::KernelSpec> specs = {unary(0), unary(1, kiln::DType::f16),
                                         unary(2, kiln::DType::bf16), unary(3, kiln::DType::f64)};
  kiln::KernelSpec missing = unary(0);
  missing.source = "elementwise/missing.cuh";
  specs.push_back(missing);
  std::vector<std::size_t> seen;
  kiln::Runtime rt(options_for(dir.path()));
  const kiln::WarmupReport report =
      rt.warmup(specs, {.threads = 3, .on_progress = [&](const kiln::WarmupProgress& p) {
                          CHECK(p.total == 5);
                          REQUIRE(p.last != nullptr);
                          seen.push_back(p.done);
                        }});
  CHECK(seen == std::vector<std::size_t>{1, 2, 3, 4, 5});
  REQUIRE(report.items.size() == 5);
  CHECK(report.count(kiln::WarmupStatus::compiled) == 4);
  CHECK(report.count(kiln::WarmupStatus::failed) == 1);
  CHECK_FALSE(report.ok());
  CHECK_THAT(report.items[4].error, Catch::Contains("elementwise/missing.cuh"));
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(report.items[i].key.size() == 32);
    CHECK(report.items[i].ms > 0);
  }
  specs.pop_back();
  kiln::Runtime fresh(options_for(dir.path()));
  const auto again = fresh.warmup(specs, {.threads = 2});
  CHECK(again.count(kiln::WarmupStatus::disk_hit) == 4);
  CHECK(again.ok());
  CHECK(fresh.warmup(specs).count(kiln::WarmupStatus::memory_hit) == 4);
}

TEST_CASE("hipRTC compiles the elementwise family for gfx90a", "[runtime]") {
  KILN_REQUIRE_HIPRTC();
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path(), "gfx90a"));
  const kiln::KernelInfo info = rt.compile(unary(9, kiln::DType::bf16));
  CHECK_THAT(info.compiler, Catch::StartsWith("hiprtc "));
  CHECK(info.target == "gfx90a");
  CHECK_FALSE(info.lowered_name.empty());
}

TEST_CASE("NVRTC compiles every dtype for sm_80 and sm_90a", "[runtime]") {
  kiln::test::TempDir dir;
  for (const char* target : {"sm_80", "sm_90a"}) {
    kiln::Runtime rt(options_for(dir.path(), target));
    for (auto dtype : {kiln::DType::f16, kiln::DType::bf16, kiln::DType::f32, kiln::DType::f64}) {
      CHECK(rt.compile(unary(10, dtype)).target == target);
    }
  }
}

TEST_CASE("a compile error carries the log, spec, options, key and dumped source", "[runtime]") {
  kiln::test::TempDir dir;
  fs::copy(fs::path(KILN_SOURCE_DIR) / "kernels_src", dir.path() / "k",
           fs::copy_options::recursive);
  const auto kernel = dir.path() / "k" / "elementwise" / "unary.cuh";
  kiln::test::write_file(kernel, kiln::test::read_file(kernel) + "\nthis is not C++;\n");
  auto options = options_for(dir.path() / "cache");
  options.kernels_dir = dir.path() / "k";
  options.dump_dir = dir.path() / "dump";
  kiln::Runtime rt(options);
  try {
    rt.compile(unary(4));
    FAIL("no error");
  } catch (const kiln::CompileError& e) {
    const kiln::CompileFailure& f = e.failure();
    CHECK_THAT(f.log, Catch::Contains("error"));
    CHECK_THAT(f.spec, Catch::Contains("elementwise/unary.cuh"));
    CHECK_THAT(f.options, Catch::Contains("--gpu-architecture=sm_90a"));
    CHECK(f.key.size() == 32);
    CHECK(fs::exists(f.source_path));
    CHECK_THAT(kiln::test::read_file(f.source_path), Catch::Contains("struct kiln_spec"));
    CHECK(fs::exists(dir.path() / "dump" / (f.key + ".log")));
    CHECK_THAT(e.what(), Catch::Contains(f.log));
  }
  CHECK(rt.stats().compile_failures == 1);
}

TEST_CASE("an edit to a kernel file takes effect at the next compile", "[runtime]") {
  kiln::test::TempDir dir;
  fs::copy(fs::path(KILN_SOURCE_DIR) / "kernels_src", dir.path() / "k",
           fs::copy_options::recursive);
  auto options = options_for(dir.path() / "cache");
  options.kernels_dir = dir.path() / "k";
  const std::string before = kiln::Runtime(options).compile(unary(4)).key;
  const auto kernel = dir.path() / "k" / "elementwise" / "unary.cuh";
  kiln::test::write_file(kernel, kiln::test::read_file(kernel) + "\n// tuned\n");
  kiln::Runtime rt(options);
  CHECK(rt.compile(unary(4)).key != before);
  CHECK(rt.stats().compiles == 1);
}

TEST_CASE("KILN_DUMP_DIR receives the unit, PTX, binary and log", "[runtime]") {
  kiln::test::TempDir dir;
  auto options = options_for(dir.path() / "cache");
  options.dump_dir = dir.path() / "dump";
  const std::string key = kiln::Runtime(options).compile(unary(5)).key;
  for (const char* extension : {".cu", ".ptx", ".cubin", ".log"}) {
    INFO(extension);
    CHECK(fs::file_size(dir.path() / "dump" / (key + extension)) > 0);
  }
}

TEST_CASE("loading needs a device of the spec's target, and says so", "[runtime]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt(options_for(dir.path(), "sm_80"));
  const bool have_gpu = !kiln::test::gpu_unavailable_reason();
  try {
    rt.kernel(unary(4));
    FAIL("no error");
  } catch (const kiln::Error& e) {
    if (have_gpu) {  // the device is an H100 or H200: sm_90a, not sm_80
      CHECK(e.category() == kiln::ErrorCategory::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("whose target is"));
    } else {
      CHECK(e.category() == kiln::ErrorCategory::not_found);
      CHECK_THAT(e.what(), Catch::Contains("to compile without loading, use Runtime::compile"));
    }
  }
}
