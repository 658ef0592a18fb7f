// SPDX-License-Identifier: Apache-2.0
// Tests for the run-time compilers, NVRTC and hipRTC: the same unit through each.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "backend/backend.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "support.hpp"

namespace kiln::detail {
namespace {

// Valid CUDA and HIP alike: hipRTC pre-includes the HIP runtime, NVRTC needs nothing for this.
constexpr std::string_view kSource = R"(#include "scale.h"
namespace test {
template <int kFactor>
__global__ void scale(Scale p) {
  __shared__ float tile[128];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < p.n ? p.in[i] : 0.0f;
  __syncthreads();
  if (i < p.n) p.out[i] = kFactor * tile[blockDim.x - 1 - threadIdx.x];
}
}  // namespace test
)";

constexpr std::string_view kHeader = R"(#pragma once
struct Scale {
  float* out;
  const float* in;
  int n;
};
)";

constexpr std::string_view kLoweredPrefix = "_ZN4test5scaleILi3EE";

// The compiler, or nullptr (with a warning) where it is not installed.
std::unique_ptr<Compiler> open_or_warn(const std::function<std::unique_ptr<Compiler>()>& open) {
  try {
    return open();
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::not_found) throw;
    WARN("skipped: " << e.what());
    return nullptr;
  }
}

CompileRequest request_for(const Compiler& compiler, std::string_view target,
                           std::string_view source = kSource) {
  CompileRequest request;
  request.name = "kiln_test.cu";
  request.source = source;
  request.headers = {{"scale.h", std::string(kHeader)}};
  request.options = compiler.canonical_options(target);
  request.name_expression = "test::scale<3>";
  return request;
}

bool is_elf(const std::vector<std::byte>& binary) {
  return binary.size() > 4 && binary[0] == std::byte{0x7f} && binary[1] == std::byte{'E'} &&
         binary[2] == std::byte{'L'} && binary[3] == std::byte{'F'};
}

bool contains(const std::vector<std::byte>& binary, std::string_view text) {
  const auto* begin = reinterpret_cast<const char*>(binary.data());
  return std::string_view(begin, binary.size()).find(text) != std::string_view::npos;
}

void check_compiled(const CompileResult& result) {
  INFO(result.log);
  REQUIRE(result.ok);
  CHECK(is_elf(result.binary));
  CHECK_THAT(result.lowered_name, Catch::StartsWith(std::string(kLoweredPrefix)));
  CHECK(contains(result.binary, result.lowered_name));
  CHECK(result.ms > 0);
}

void check_rejected(const CompileResult& result, std::string_view expected_in_log) {
  CHECK_FALSE(result.ok);
  CHECK(result.binary.empty());
  CHECK(result.lowered_name.empty());
  CHECK_THAT(result.log, Catch::Contains(std::string(expected_in_log)));
}

TEST_CASE("NVRTC compiles a templated kernel with an in-memory header", "[backend]") {
  const auto nvrtc = open_or_warn(open_nvrtc);
  if (!nvrtc) return;
  CHECK(nvrtc->vendor() == Vendor::nvidia);
  CHECK_THAT(nvrtc->identity(), Catch::Matches("nvrtc [0-9]+\\.[0-9]+"));

  for (const std::string target : {"sm_80", "sm_90a"}) {
    CAPTURE(target);
    const CompileResult result = nvrtc->compile(request_for(*nvrtc, target));
    check_compiled(result);
    CHECK_THAT(result.intermediate, Catch::Contains(".entry " + result.lowered_name));
    CHECK_THAT(result.intermediate, Catch::Contains(".target " + target));
    CHECK(result.usage.registers > 0);
    CHECK(result.usage.shared_bytes == 128 * 4);
    CHECK(result.usage.spill_bytes == 0);
    CHECK(result.usage.stack_bytes == 0);
  }
}

TEST_CASE("NVRTC finds the toolkit's headers", "[backend]") {
  const auto nvrtc = open_or_warn(open_nvrtc);
  if (!nvrtc) return;
  const std::string source =
      "#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n" + std::string(kSource);
  check_compiled(nvrtc->compile(request_for(*nvrtc, "sm_90a", source)));
}

TEST_CASE("NVRTC returns errors in the log instead of throwing", "[backend]") {
  const auto nvrtc = open_or_warn(open_nvrtc);
  if (!nvrtc) return;
  SECTION("syntax error") {
    const std::string source = std::string(kSource) + "__global__ void broken( { }\n";
    check_rejected(nvrtc->compile(request_for(*nvrtc, "sm_90a", source)), "error");
  }
  SECTION("missing header") {
    const std::string source = "#include \"missing_header.h\"\n" + std::string(kSource);
    check_rejected(nvrtc->compile(request_for(*nvrtc, "sm_90a", source)), "missing_header.h");
  }
  SECTION("target it does not know") {
    check_rejected(nvrtc->compile(request_for(*nvrtc, "sm_10")), "--gpu-architecture");
  }
}

TEST_CASE("NVRTC options and targets", "[backend]") {
  const auto nvrtc = open_or_warn(open_nvrtc);
  if (!nvrtc) return;
  const std::vector<std::string> expected = {"--gpu-architecture=sm_90a", "-std=c++17"};
  CHECK(nvrtc->canonical_options("sm_90a") == expected);

  CHECK(nvrtc->accepts("sm_90a"));
  CHECK(nvrtc->accepts("sm_90"));
  CHECK(nvrtc->accepts("sm_80"));
  CHECK_FALSE(nvrtc->accepts("sm_80a"));  // arch-specific targets start with Hopper
  CHECK_FALSE(nvrtc->accepts("sm_10"));
  CHECK_FALSE(nvrtc->accepts("gfx90a"));

  const std::vector<Target> targets = nvrtc->targets();
  CHECK(std::count(targets.begin(), targets.end(), Target("sm_90a")) == 1);
  CHECK(std::count(targets.begin(), targets.end(), Target("sm_80")) == 1);
  for (const Target& target : targets) CHECK(nvrtc->accepts(target));
}

TEST_CASE("hipRTC compiles a templated kernel with an in-memory header", "[backend]") {
  KILN_REQUIRE_HIPRTC();
  const auto hiprtc = open_hiprtc();
  CHECK(hiprtc->vendor() == Vendor::amd);
  CHECK_THAT(hiprtc->identity(), Catch::StartsWith("hiprtc "));

  const CompileResult result = hiprtc->compile(request_for(*hiprtc, "gfx90a"));
  check_compiled(result);
  // Resource usage is reported only by compilers that know the remark; never made up.
  CHECK((result.usage.registers > 0 || result.usage.registers == -1));
}

TEST_CASE("hipRTC returns a syntax error in the log instead of throwing", "[backend]") {
  KILN_REQUIRE_HIPRTC();
  const auto hiprtc = open_hiprtc();
  const std::string source = std::string(kSource) + "__global__ void broken( { }\n";
  check_rejected(hiprtc->compile(request_for(*hiprtc, "gfx90a", source)), "error");
}

TEST_CASE("hipRTC options and targets", "[backend]") {
  KILN_REQUIRE_HIPRTC();
  const auto hiprtc = open_hiprtc();
  const std::vector<std::string> expected = {"--offload-arch=gfx90a", "-O3", "-std=c++17"};
  CHECK(hiprtc->canonical_options("gfx90a") == expected);

  CHECK(hiprtc->accepts("gfx90a"));
  CHECK_FALSE(hiprtc->accepts("sm_90a"));

  const std::vector<Target> targets = hiprtc->targets();
  CHECK(std::count(targets.begin(), targets.end(), Target("gfx90a")) == 1);
}

// NOTE: comgr of ROCm 5.2 aborts the process (munmap_chunk(): invalid pointer) for an ISA it
// does not know, so hipRTC must never be asked to build one.
TEST_CASE("hipRTC accepts only the targets its comgr lists", "[backend]") {
  KILN_REQUIRE_HIPRTC();
  const auto hiprtc = open_hiprtc();
  // No comgr knows these; the ones of a given ROCm are checked below against what it lists.
  for (const char* target : {"gfx9999", "gfxabc"}) {
    INFO(target);
    CHECK_FALSE(hiprtc->accepts(target));
  }
  if (hiprtc->identity().find("(hip 5.2.") != std::string::npos) {
    CHECK_FALSE(hiprtc->accepts("gfx942"));
    CHECK_FALSE(hiprtc->accepts("gfx1100"));
    CHECK(hiprtc->accepts("gfx1030"));
  }
}

// The C API's warm-up of the default set reaches the same refusal: it used to kill its caller.
TEST_CASE("kiln_warmup_default refuses an AMD target hipRTC cannot build", "[backend]") {
  KILN_REQUIRE_HIPRTC();
  const test::TempDir cache;
  const test::ScopedEnv cache_dir("KILN_CACHE_DIR", cache.path().c_str());
  const test::ScopedEnv kernels("KILN_KERNELS_DIR", KILN_SOURCE_DIR "/kernels_src");
  CHECK(kiln_warmup_default("gfx9ff", 1) != KILN_OK);  // a gfx9 target no comgr has
  const std::string message = kiln_last_error();
  INFO(message);
  CHECK_THAT(message, Catch::Contains("target 'gfx9ff' is not one hiprtc"));
  CHECK_THAT(message, Catch::Contains("gfx90a"));
}

}  // namespace
}  // namespace kiln::detail
