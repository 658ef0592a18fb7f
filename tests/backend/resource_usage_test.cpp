// SPDX-License-Identifier: Apache-2.0
// Tests for reading resource usage out of ptxas and AMDGPU logs.
#include <catch2/catch.hpp>

#include "backend/resource_usage.hpp"

namespace kiln::detail {
namespace {

// As NVRTC 13.0 prints it with -Xptxas=-v for a unit with two kernels and a device function.
constexpr std::string_view kPtxasLog =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function '_ZN2ns1kILi3EEEvPf' for 'sm_90a'\n"
    "ptxas info    : Function properties for _ZN2ns1kILi3EEEvPf\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem\n"
    "ptxas info    : Compile time = 4.176 ms\n"
    "ptxas info    : Compiling entry function '_Z5otherPf' for 'sm_90a'\n"
    "ptxas info    : Function properties for _Z5otherPf\n"
    "ptxas         .     256 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads\n"
    "ptxas info    : Used 34 registers, used 0 barriers, 256 bytes cumulative stack size\n"
    "ptxas info    : Compile time = 10.343 ms\n"
    "ptxas info    : Function properties for _Z6helperf\n"
    "ptxas         .     64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";

// The remarks LLVM's AMDGPU backend prints for -Rpass-analysis=kernel-resource-usage.
constexpr std::string_view kAmdgpuLog =
    "remark: k.cu:3:0: Function Name: _Z5firstPf [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     SGPRs: 12 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     VGPRs: 9 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     AGPRs: 0 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     ScratchSize [bytes/lane]: 0 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     Occupancy [waves/SIMD]: 8 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     SGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     VGPRs Spill: 0 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:3:0:     LDS Size [bytes/block]: 512 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0: Function Name: _Z6secondPf [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     SGPRs: 40 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     VGPRs: 128 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     ScratchSize [bytes/lane]: 96 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     SGPRs Spill: 3 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     VGPRs Spill: 5 [-Rpass-analysis=kernel-resource-usage]\n"
    "remark: k.cu:9:0:     LDS Size [bytes/block]: 0 [-Rpass-analysis=kernel-resource-usage]\n";

void check_usage(const ResourceUsage& usage, int registers, int spill, int shared, int stack) {
  CHECK(usage.registers == registers);
  CHECK(usage.spill_bytes == spill);
  CHECK(usage.shared_bytes == shared);
  CHECK(usage.stack_bytes == stack);
}

TEST_CASE("ptxas usage is read for the named entry", "[backend]") {
  check_usage(parse_ptxas_usage(kPtxasLog, "_ZN2ns1kILi3EEEvPf"), 10, 0, 1024, 0);
  // No smem on the "Used" line means none; spills are stores plus loads.
  check_usage(parse_ptxas_usage(kPtxasLog, "_Z5otherPf"), 34, 20, 0, 256);
}

TEST_CASE("ptxas usage falls back to the first entry, and to -1", "[backend]") {
  check_usage(parse_ptxas_usage(kPtxasLog, "_Z7missingv"), 10, 0, 1024, 0);
  check_usage(parse_ptxas_usage(kPtxasLog, ""), 10, 0, 1024, 0);
  check_usage(parse_ptxas_usage("", "_Z5otherPf"), -1, -1, -1, -1);
  check_usage(parse_ptxas_usage("ptxas info    : Used 1 registers\n", ""), 1, -1, 0, -1);
}

TEST_CASE("AMDGPU usage is read for the named entry", "[backend]") {
  check_usage(parse_amdgpu_usage(kAmdgpuLog, "_Z5firstPf"), 9, 0, 512, 0);
  check_usage(parse_amdgpu_usage(kAmdgpuLog, "_Z6secondPf"), 128, 20, 0, 96);
  check_usage(parse_amdgpu_usage(kAmdgpuLog, "_Z7missingv"), 9, 0, 512, 0);
  // hipRTC 5.x ignores the remark flag and prints nothing.
  check_usage(parse_amdgpu_usage("", "_Z5firstPf"), -1, -1, -1, -1);
}

}  // namespace
}  // namespace kiln::detail
