// Each family's launch plan: the threads and shared memory its kernels declare, and the check
// of a plan against a device's limits.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>

#include <fmt/format.h>

#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "kiln/params/attention.h"
#include "kiln/params/decode.h"
#include "ops/attention_plan.hpp"
#include "ops/decode_kernels.hpp"
#include "params/registry.hpp"
#include "support.hpp"

namespace kiln {
namespace {

using detail::LaunchPlan;

constexpr AttentionProblem kD128{.dtype = DType::bf16, .head_dim = 128, .head_dim_v = 128};

// The plan's shared memory is the registry's for its spec, which `kiln compile` reports.
void check_registry_agrees(const LaunchPlan& plan) {
  INFO(to_string(plan.spec));
  CHECK(detail::dynamic_shared_bytes(plan.spec) == plan.shared_bytes);
}

// A device that takes `threads` threads and `shared_bytes` of dynamic shared memory per CTA.
DeviceInfo device_with(int threads, int shared_bytes) {
  return {.ordinal = 1,
          .name = "Small GPU",
          .target = "sm_86",
          .max_threads_per_block = threads,
          .max_shared_bytes_per_block = shared_bytes};
}

TEST_CASE("attention plans the CTA each kernel declares", "[attention][plan]") {
  const AttentionConfig mma = choose(kD128, "sm_80");
  REQUIRE(mma.kernel == AttentionKernel::mma);
  const LaunchPlan mma_plan = detail::attention_plan(kD128, mma);
  CHECK(mma_plan.spec == attention_spec(kD128, mma));
  CHECK(mma_plan.threads == mma.warps * 32);
  // round_up(128, 16) + 8 = 136 columns: 2 bytes * (128 * 136 + 1 stage * 64 * (136 + 136)).
  CHECK(mma_plan.shared_bytes == 2 * (128 * 136 + 64 * 272));
  check_registry_agrees(mma_plan);

  const AttentionConfig tma = choose(kD128, "sm_90a");
  REQUIRE(tma.kernel == AttentionKernel::tma);
  const LaunchPlan tma_plan = detail::attention_plan(kD128, tma);
  CHECK(tma_plan.threads == 2 * 128 + 128);  // two consumer warpgroups and the producer's
  CHECK(tma_plan.shared_bytes ==
        attention_forward_tma_smem_bytes(128, 128, tma.block_m, tma.block_n, tma.stages));
  check_registry_agrees(tma_plan);

  AttentionConfig wgmma = tma;
  wgmma.kernel = AttentionKernel::wgmma;
  const LaunchPlan wgmma_plan = detail::attention_plan(kD128, wgmma);
  CHECK(wgmma_plan.threads == 2 * 128);  // a warpgroup per 64 rows
  CHECK(wgmma_plan.shared_bytes ==
        attention_forward_wgmma_smem_bytes(128, 128, tma.block_m, tma.block_n, tma.stages));
  check_registry_agrees(wgmma_plan);

  const AttentionConfig portable = choose(kD128, "gfx90a");
  const LaunchPlan portable_plan = detail::attention_plan(kD128, portable);
  CHECK(portable_plan.threads == portable.warps * 32);
  CHECK(portable_plan.shared_bytes == 2 * portable.block_n * (128 + 128));
  check_registry_agrees(portable_plan);
}

TEST_CASE("decode decides its row tiles once, in choose(), and plans from them", "[decode][plan]") {
  const auto problem = [](int rows, int dim) {
    return DecodeProblem{
        .head_dim = dim, .head_dim_v = dim, .rows_per_kv_head = rows, .capacity = 4096};
  };
  // Rows of a kv head, head dim, the row tiles a CTA packs.
  for (const auto& [rows, dim, m_tiles] :
       {std::tuple{8, 64, 1}, std::tuple{32, 64, 2}, std::tuple{64, 64, 4}, std::tuple{64, 128, 2},
        std::tuple{64, 256, 1}}) {
    INFO(rows << " rows, head dim " << dim);
    const DecodeProblem p = problem(rows, dim);
    const DecodeConfig config = choose(p, 132);
    CHECK(config.m_tiles == m_tiles);
    CHECK(detail::decode_row_blocks(p, config) == (rows + 16 * m_tiles - 1) / (16 * m_tiles));
    const LaunchPlan plan = detail::decode_attention_plan(p, config);
    CHECK(test::contains(to_string(plan.spec), "m_tiles=" + std::to_string(m_tiles)));
    CHECK(plan.threads == config.warps * 32);
    CHECK(plan.shared_bytes == attention_decode_smem_bytes(dim, dim, m_tiles, config.block_n,
                                                           config.warps, config.stages));
    check_registry_agrees(plan);
  }
  // d128, one row tile: 3 stages fit the 112 KiB a CTA aims at, 4 would not.
  const DecodeConfig d128 = choose(problem(8, 128), 132);
  CHECK(d128.stages == 3);
  CHECK(detail::decode_attention_plan(problem(8, 128), d128).shared_bytes ==
        2 * (16 * 128 + 4 * 3 * 16 * 256));

  // The append and merge kernels are written for 128 threads and take no shared memory.
  for (const LaunchPlan& plan : {detail::decode_append_plan(problem(8, 128)),
                                 detail::merge_plan(DType::f32, DType::bf16, 128)}) {
    CHECK(plan.threads == 128);
    CHECK(plan.shared_bytes == 0);
    check_registry_agrees(plan);
  }
}

TEST_CASE("a plan is checked against the device's threads and shared memory per CTA", "[plan]") {
  const LaunchPlan tma = detail::attention_plan(kD128, choose(kD128, "sm_90a"));
  const LaunchPlan mma = detail::attention_plan(kD128, choose(kD128, "sm_80"));
  const int sm86 = 99 * 1024;  // sm_86's opt-in maximum

  CHECK_FALSE(detail::exceeded_limit(mma, device_with(1024, sm86)));
  // Threads first: the tma kernel's CTA has 384.
  CHECK(detail::exceeded_limit(tma, device_with(256, sm86)) ==
        "384 threads per CTA, but device 1 (Small GPU) runs at most 256");
  CHECK(detail::exceeded_limit(tma, device_with(1024, sm86)) ==
        fmt::format("{} bytes of dynamic shared memory per CTA, but device 1 (Small GPU) allows "
                    "at most {}",
                    tma.shared_bytes, sm86));
  // Exactly at the limit fits; a limit the driver did not report (0) is not checked.
  CHECK_FALSE(
      detail::exceeded_limit(tma, device_with(tma.threads, static_cast<int>(tma.shared_bytes))));
  CHECK_FALSE(detail::exceeded_limit(tma, device_with(0, 0)));

  // Decode at d128 plans 100 KiB, over sm_86's 99.
  const DecodeProblem d128{.head_dim = 128, .head_dim_v = 128, .rows_per_kv_head = 8};
  const DecodeConfig config = choose(d128, 84);
  const LaunchPlan decode = detail::decode_attention_plan(d128, config);
  CHECK_THROWS_WITH(
      detail::require_fits(decode, config, device_with(1024, sm86)),
      "decode config (block_n 16, warps 4, stages 3, m_tiles 1) needs 102400 bytes of dynamic "
      "shared memory per CTA, but device 1 (Small GPU) allows at most 101376: choose() plans "
      "decode for 112 KiB of shared memory per CTA, which this device does not give; smaller "
      "head dims need less");
  CHECK_NOTHROW(detail::require_fits(decode, config, device_with(1024, 227 * 1024)));
}

}  // namespace
}  // namespace kiln
