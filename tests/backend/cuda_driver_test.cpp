// SPDX-License-Identifier: Apache-2.0
// Tests for the CUDA driver backend: devices, loading NVRTC cubins, launches.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.hpp"
#include "backend/dynlib.hpp"
#include "kiln/error.hpp"
#include "kiln/target.hpp"
#include "support.hpp"

namespace kiln::detail {
namespace {

constexpr std::string_view kSource = R"(#include "fill.h"
namespace test {
template <unsigned kMultiplier>
__global__ void fill(const __grid_constant__ FillParams p) {
  extern __shared__ unsigned staging[];
  for (unsigned s = threadIdx.x; s < p.shared_words; s += blockDim.x) staging[s] = s;
  __syncthreads();
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned last = p.shared_words > 0 ? staging[p.shared_words - 1] : 0u;
  if (i < p.n) p.out[i] = i * kMultiplier + p.offset + last;
}
}  // namespace test
)";

constexpr std::string_view kHeader = R"(#pragma once
struct FillParams {
  unsigned* out;
  unsigned n;
  unsigned offset;
  unsigned shared_words;
};
)";

constexpr std::uint32_t kMultiplier = 7;

// Two kernels for programmatic dependent launch: the first lets its dependent be scheduled at
// once, then spins before writing `first`; the second, launched to overlap it, waits for it and
// then reads `first`. Without the wait (or with the launch misconfigured) the second reads what
// `first` held before: the poison, or the previous round's values.
constexpr std::string_view kChainSource = R"(#include "chain.h"
namespace test {
__global__ void slow_fill(const __grid_constant__ ChainParams p) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long start = clock64();
  while (clock64() - start < p.spin_cycles) {
  }
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.first[i] = 3 * i + p.round;
}
__global__ void add_one_after_wait(const __grid_constant__ ChainParams p) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.second[i] = p.first[i] + 1;
}
}  // namespace test
)";

constexpr std::string_view kChainHeader = R"(#pragma once
struct ChainParams {
  unsigned* first;
  unsigned* second;
  unsigned n;
  unsigned round;
  long long spin_cycles;
};
)";

using CUdeviceptr = unsigned long long;

// The host side of FillParams.
struct FillParams {
  CUdeviceptr out = 0;
  std::uint32_t n = 0;
  std::uint32_t offset = 0;
  std::uint32_t shared_words = 0;
};

// The host side of ChainParams.
struct ChainParams {
  CUdeviceptr first = 0;
  CUdeviceptr second = 0;
  std::uint32_t n = 0;
  std::uint32_t round = 0;
  std::int64_t spin_cycles = 0;
};

// Device memory, which the Driver interface leaves to kiln's callers, straight from libcuda. It
// works in the context load() made current on this thread.
class DeviceWords {
 public:
  explicit DeviceWords(std::size_t count)
      : lib_(DynLib::open("libcuda", candidates_, "install the NVIDIA driver")), count_(count) {
    REQUIRE(lib_.symbol<Alloc>("cuMemAlloc_v2")(&pointer_, bytes()) == 0);
    REQUIRE(lib_.symbol<Set>("cuMemsetD32_v2")(pointer_, 0xdeadbeef, count_) == 0);
  }
  ~DeviceWords() { lib_.symbol<Free>("cuMemFree_v2")(pointer_); }
  DeviceWords(const DeviceWords&) = delete;
  DeviceWords& operator=(const DeviceWords&) = delete;

  CUdeviceptr get() const { return pointer_; }

  // Waits for the context's work, then copies back.
  std::vector<std::uint32_t> read() const {
    REQUIRE(lib_.symbol<Sync>("cuCtxSynchronize")() == 0);
    std::vector<std::uint32_t> words(count_);
    REQUIRE(lib_.symbol<Copy>("cuMemcpyDtoH_v2")(words.data(), pointer_, bytes()) == 0);
    return words;
  }

 private:
  using Alloc = int (*)(CUdeviceptr*, std::size_t);
  using Set = int (*)(CUdeviceptr, unsigned, std::size_t);
  using Free = int (*)(CUdeviceptr);
  using Sync = int (*)();
  using Copy = int (*)(void*, CUdeviceptr, std::size_t);

  std::size_t bytes() const { return count_ * sizeof(std::uint32_t); }

  static inline const std::array<std::string, 1> candidates_ = {"libcuda.so.1"};
  DynLib lib_;
  std::size_t count_;
  CUdeviceptr pointer_ = 0;
};

// The CUDA driver, or nullptr (with a warning) where libcuda or a device is missing.
std::unique_ptr<Driver> open_device_or_warn() {
  try {
    auto driver = open_cuda_driver();
    if (driver->device_count() > 0) return driver;
    WARN("skipped: the CUDA driver sees no device");
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::not_found) throw;
    WARN("skipped: " << e.what());
  }
  return nullptr;
}

CompileResult compile_kernel(const std::string& target, std::string_view source,
                             std::string_view header_name, std::string_view header,
                             const std::string& name_expression) {
  const auto nvrtc = open_nvrtc();
  CompileRequest request;
  request.name = "kiln_test.cu";
  request.source = source;
  request.headers = {{std::string(header_name), std::string(header)}};
  request.options = nvrtc->canonical_options(target);
  request.name_expression = name_expression;
  CompileResult result = nvrtc->compile(request);
  INFO(result.log);
  REQUIRE(result.ok);
  return result;
}

CompileResult compile_fill(const std::string& target) {
  return compile_kernel(target, kSource, "fill.h", kHeader,
                        "test::fill<" + std::to_string(kMultiplier) + ">");
}

void check_pattern(const std::vector<std::uint32_t>& words, const FillParams& params) {
  const std::uint32_t last = params.shared_words > 0 ? params.shared_words - 1 : 0;
  std::size_t wrong = 0;
  for (std::uint32_t i = 0; i < words.size(); ++i) {
    if (words[i] != i * kMultiplier + params.offset + last) ++wrong;
  }
  CHECK(wrong == 0);
}

TEST_CASE("open_cuda_driver works or names libcuda.so.1", "[backend]") {
  try {
    const auto driver = open_cuda_driver();
    CHECK(driver->vendor() == Vendor::nvidia);
    CHECK_THAT(driver->version(), Catch::Matches("cuda driver [0-9]+\\.[0-9]+"));
    CHECK(driver->device_count() >= 0);
    CHECK_THROWS_AS(driver->device(driver->device_count()), Error);
    CHECK_THROWS_AS(driver->device(-1), Error);
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("libcuda.so.1"));
    CHECK_THAT(e.what(), Catch::Contains("install the NVIDIA driver"));
  }
}

TEST_CASE("CUDA devices describe themselves", "[backend][gpu]") {
  KILN_REQUIRE_GPU();
  const auto driver = open_device_or_warn();
  if (!driver) return;
  for (int ordinal = 0; ordinal < driver->device_count(); ++ordinal) {
    const DeviceInfo info = driver->device(ordinal);
    CHECK(info.ordinal == ordinal);
    CHECK_FALSE(info.name.empty());
    CHECK(info.multiprocessors > 0);
    CHECK(info.memory_bytes > 0);
    CHECK_THAT(info.target, Catch::Matches("sm_[0-9]+a?"));
    CHECK(Target(info.target).nvidia());
  }
}

TEST_CASE("CUDA driver loads an NVRTC cubin and launches it", "[backend][gpu]") {
  KILN_REQUIRE_GPU();
  const auto driver = open_device_or_warn();
  if (!driver) return;
  const CompileResult compiled = compile_fill(driver->device(0).target);
  const auto function = driver->load(0, compiled.binary, compiled.lowered_name);

  FillParams params;
  params.n = 1023;
  params.offset = 11;
  DeviceWords out(params.n);
  params.out = out.get();
  LaunchConfig config;
  config.block.x = 128;
  config.grid.x = (params.n + config.block.x - 1) / config.block.x;

  SECTION("with no dynamic shared memory") {
    function->launch(config, &params);
    check_pattern(out.read(), params);
  }
  SECTION("with more dynamic shared memory than the 48 KiB default") {
    params.shared_words = 100 * 1024 / 4;
    config.shared_bytes = params.shared_words * 4;
    function->launch(config, &params);
    check_pattern(out.read(), params);
    // Less than before needs no new opt-in.
    params.shared_words = 60 * 1024 / 4;
    config.shared_bytes = params.shared_words * 4;
    function->launch(config, &params);
    check_pattern(out.read(), params);
  }
  SECTION("from a thread with no current context") {
    std::thread([&] { function->launch(config, &params); }).join();
    check_pattern(out.read(), params);
  }
  SECTION("with more shared memory than the device has") {
    params.shared_words = 1024 * 1024 / 4;
    config.shared_bytes = params.shared_words * 4;
    try {
      function->launch(config, &params);
      FAIL("a launch with 1 MiB of shared memory did not throw");
    } catch (const Error& e) {
      CHECK(e.category() == ErrorCategory::invalid_argument);
      CHECK_THAT(e.what(), Catch::Contains("1048576 bytes of dynamic shared memory"));
    }
  }
}

TEST_CASE("CUDA driver launches a kernel to overlap the one before it", "[backend][gpu]") {
  KILN_REQUIRE_GPU();
  const auto driver = open_device_or_warn();
  if (!driver) return;
  const std::string target = driver->device(0).target;
  const CompileResult fill =
      compile_kernel(target, kChainSource, "chain.h", kChainHeader, "test::slow_fill");
  const CompileResult add =
      compile_kernel(target, kChainSource, "chain.h", kChainHeader, "test::add_one_after_wait");
  const auto slow_fill = driver->load(0, fill.binary, fill.lowered_name);
  const auto add_one = driver->load(0, add.binary, add.lowered_name);

  ChainParams params;
  params.n = 4099;
  params.spin_cycles = 2'000'000;  // about a millisecond, far longer than a launch
  DeviceWords first(params.n);     // poisoned
  DeviceWords second(params.n);
  params.first = first.get();
  params.second = second.get();
  LaunchConfig config;
  config.block.x = 128;
  config.grid.x = (params.n + config.block.x - 1) / config.block.x;
  LaunchConfig overlapping = config;
  overlapping.overlap_previous = true;
  for (params.round = 1; params.round <= 3; ++params.round) {
    slow_fill->launch(config, &params);
    add_one->launch(overlapping, &params);
    const std::vector<std::uint32_t> words = second.read();
    std::size_t wrong = 0;
    for (std::uint32_t i = 0; i < words.size(); ++i) {
      if (words[i] != 3 * i + params.round + 1) ++wrong;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("CUDA driver refuses binaries it cannot load", "[backend][gpu]") {
  KILN_REQUIRE_GPU();
  const auto driver = open_device_or_warn();
  if (!driver) return;
  const std::vector<std::byte> garbage(256, std::byte{0x5a});
  try {
    driver->load(0, garbage, "_Z4nonev");
    FAIL("loading garbage did not throw");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::driver);
    CHECK_THAT(e.what(), Catch::Contains("cuModuleLoadData"));
  }

  const CompileResult compiled = compile_fill(driver->device(0).target);
  try {
    driver->load(0, compiled.binary, "_Z13not_in_modulev");
    FAIL("loading a missing function did not throw");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::driver);
    CHECK_THAT(e.what(), Catch::Contains("cuModuleGetFunction"));
    CHECK_THAT(e.what(), Catch::Contains("_Z13not_in_modulev"));
  }
}

}  // namespace
}  // namespace kiln::detail
