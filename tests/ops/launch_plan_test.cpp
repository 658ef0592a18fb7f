// SPDX-License-Identifier: Apache-2.0
// Each family's launch plan: the threads and shared memory its kernels declare, and the check
// of a plan against a device's limits.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "kernels/attention.hpp"
#include "kernels/attention_backward.hpp"
#include "kernels/decode.hpp"
#include "kiln/attention.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/decode.hpp"
#include "kiln/params/attention.h"
#include "kiln/params/attention_backward.h"
#include "kiln/params/decode.h"
#include "ops/validation_support.hpp"
#include "params/registry.hpp"
#include "support.hpp"

namespace kiln {
namespace {

using detail::LaunchPlan;

constexpr AttentionProblem kD128{.head_dim = 128, .head_dim_v = 128};

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
  CHECK(tma_plan.shared_bytes == attention_forward_tma_smem_bytes(
                                     128, 128, tma.block_m, tma.block_n, tma.stages, 2, 2, 2, 2));
  check_registry_agrees(tma_plan);

  AttentionConfig wgmma = tma;
  wgmma.kernel = AttentionKernel::wgmma;
  const LaunchPlan wgmma_plan = detail::attention_plan(kD128, wgmma);
  CHECK(wgmma_plan.threads == 2 * 128);  // a warpgroup per 64 rows
  CHECK(wgmma_plan.shared_bytes == attention_forward_wgmma_smem_bytes(
                                       128, 128, tma.block_m, tma.block_n, tma.stages, 2, 2, 2));
  check_registry_agrees(wgmma_plan);

  const AttentionConfig portable = choose(kD128, "gfx90a");
  const LaunchPlan portable_plan = detail::attention_plan(kD128, portable);
  CHECK(portable_plan.threads == portable.warps * 32);
  CHECK(portable_plan.shared_bytes == 2 * portable.block_n * (128 + 128));
  check_registry_agrees(portable_plan);

  // fp8 k and v: the tma kernel plans its staging entries; inputs TMA cannot tile fall back to
  // the mma kernel (wgmma reads no fp8), the others to wgmma on the same tiles.
  AttentionProblem fp8 = kD128;
  fp8.dtype_kv = DType::e4m3;
  const AttentionConfig fp8_tma = choose(fp8, "sm_90a");
  REQUIRE(fp8_tma.kernel == AttentionKernel::tma);
  const LaunchPlan fp8_plan = detail::attention_plan(fp8, fp8_tma);
  // bf16 q over e4m3 k and v: q split, Q K^T's operands of 1 byte.
  CHECK(fp8_plan.shared_bytes == attention_forward_tma_smem_bytes(128, 128, fp8_tma.block_m,
                                                                  fp8_tma.block_n, fp8_tma.stages,
                                                                  2, 1, 1, 2));
  CHECK(fp8_plan.shared_bytes <= attention_forward_tma_budget_bytes());
  check_registry_agrees(fp8_plan);
  const AttentionConfig fp8_mma = detail::without_tma(fp8, fp8_tma);
  const AttentionConfig sm89 = choose(fp8, "sm_89");
  CHECK(fp8_mma.kernel == AttentionKernel::mma);
  CHECK((fp8_mma.block_m == sm89.block_m && fp8_mma.block_n == sm89.block_n &&
         fp8_mma.warps == sm89.warps && fp8_mma.stages == sm89.stages));
  const AttentionConfig untiled = detail::without_tma(kD128, tma);
  CHECK(untiled.kernel == AttentionKernel::wgmma);
  CHECK((untiled.block_m == tma.block_m && untiled.block_n == tma.block_n));
}

// Where its warpgroups split the head dims (above 128), the wgmma dk/dv kernel's default adds dQ
// from registers and streams two slots; deterministic calls stage dQ and stream one. At 192
// (padded to 256 columns) and 256/64 the two layouts differ, so a plan or spec that lost the flag
// would be caught.
TEST_CASE("the wgmma backward plans its shared memory with deterministic",
          "[attention_backward][plan]") {
  // 1024 + the tiles, 2 * 64 * (qk + v + 256) with the head dims padded to 128, then two slots of
  // 2 * 64 * (qk + v) and their LSE and D (1024); or the staging block (64 * head_dim floats) and
  // one slot with its LSE and D (+ 512, rounded up to 1024).
  const struct {
    int head_dim, head_dim_v;
    long long plain, deterministic;
  } rows[] = {
      {192, 192, 1024 + 98304 + 131072 + 1024, 1024 + 98304 + 49152 + 66560},
      {256, 64, 1024 + 81920 + 98304 + 1024, 1024 + 81920 + 65536 + 50176},
      {256, 256, 1024 + 98304 + 131072 + 1024, 1024 + 98304 + 65536 + 66560},
  };
  for (const auto& row : rows) {
    for (const bool deterministic : {false, true}) {
      const AttentionBackwardProblem problem{
          .forward = {.head_dim = row.head_dim, .head_dim_v = row.head_dim_v},
          .deterministic = deterministic};
      const AttentionBackwardConfig config = choose(problem, "sm_90a");
      INFO(row.head_dim << "/" << row.head_dim_v << " deterministic " << deterministic);
      REQUIRE(config.kernel == AttentionBackwardKernel::wgmma);
      REQUIRE(attention_backward_wgmma_column_groups(config.block_n, config.warps) == 2);
      const detail::AttentionBackwardPlan plan = detail::attention_backward_plan(problem, config);
      CHECK(plan.dkdv.shared_bytes == (deterministic ? row.deterministic : row.plain));
      check_registry_agrees(plan.dkdv);
    }
  }
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
    const DecodeConfig config = choose(p, "sm_90a", 132);
    CHECK(config.m_tiles == m_tiles);
    CHECK(detail::decode_row_blocks(p, config) == (rows + 16 * m_tiles - 1) / (16 * m_tiles));
    const LaunchPlan plan = detail::decode_attention_plan(p, config);
    CHECK(test::contains(to_string(plan.spec), "m_tiles=" + std::to_string(m_tiles)));
    CHECK(plan.threads == config.warps * 32);
    CHECK(plan.shared_bytes == attention_decode_smem_bytes(dim, dim, m_tiles, config.block_n,
                                                           config.warps, config.stages, 2, 2,
                                                           false));
    check_registry_agrees(plan);
  }
  // d128, one row tile: 3 stages fit the 112 KiB a CTA aims at, 4 would not.
  const DecodeConfig d128 = choose(problem(8, 128), "sm_90a", 132);
  CHECK(d128.stages == 3);
  CHECK(detail::decode_attention_plan(problem(8, 128), d128).shared_bytes ==
        2 * (16 * 128 + 4 * 3 * 16 * 256));

  // The append and merge kernels launch the threads their __launch_bounds__ name (params/decode.h)
  // and take no shared memory.
  CHECK(detail::decode_append_plan(problem(8, 128)).threads == kDecodeAppendThreads);
  CHECK(detail::merge_plan(DType::f32, DType::bf16, 128).threads == kMergeThreads);
  for (const LaunchPlan& plan : {detail::decode_append_plan(problem(8, 128)),
                                 detail::merge_plan(DType::f32, DType::bf16, 128)}) {
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

  // Decode at d128 planned for sm_80 takes 100 KiB, over sm_86's 99: a runtime whose target is
  // not its device's (Options::target) is told to use the device's.
  const DecodeProblem d128{.head_dim = 128, .head_dim_v = 128, .rows_per_kv_head = 8};
  const DecodeConfig config = choose(d128, "sm_80", 84);
  const detail::DecodePlan decode = detail::decode_plan(d128, config);
  const Target sm80("sm_80"), sm90a("sm_90a");
  CHECK_THROWS_WITH(
      detail::require_fits(decode, config, &sm80, device_with(1024, sm86)),
      "decode config (block_n 16, warps 4, stages 3, m_tiles 1) needs 102400 bytes of dynamic "
      "shared memory per CTA, but device 1 (Small GPU) allows at most 101376: choose() planned "
      "it for the target sm_80, whose CTAs may take 166912 bytes; run with the device's own "
      "target (sm_86)");
  CHECK_NOTHROW(detail::require_fits(decode, config, &sm90a, device_with(1024, 227 * 1024)));
  // A caller's config (no target planned it) is told to take a smaller one.
  CHECK_THROWS_WITH(detail::require_fits(decode, config, nullptr, device_with(1024, sm86)),
                    Catch::EndsWith("allows at most 101376: pass a config with fewer warps or "
                                    "stages or a smaller block_n (or choose()'s config)"));
}

// A kernel that splits its registers between warpgroups (setmaxnreg) is refused when its build
// gave a thread fewer registers than the split claims: its setmaxnreg.inc would wait forever.
TEST_CASE("a setmaxnreg kernel built with fewer registers than its split claims is refused",
          "[plan]") {
  // The tma forward claims all of its launch's registers with two or three consumer warpgroups
  // (384 or 512 threads: 168 or 128 a thread), but not with one (256 threads, built with 240 at
  // most: 32 + 240 over two warpgroups, 136); the wgmma dk/dv kernel all of its launch's.
  CHECK(attention_forward_tma_least_registers(128) == 168);
  CHECK(attention_forward_tma_least_registers(192) == 128);
  CHECK(attention_forward_tma_least_registers(64) == 136);
  CHECK(attention_backward_wgmma_least_registers(4) == 128);
  CHECK(attention_backward_wgmma_least_registers(8) == 168);
  KernelInfo info;
  info.spec = "attention/prefill/forward_tma.cuh:kiln::attention_forward_tma<...>";
  info.compiler = "nvrtc 13.0";
  // As many as claimed, more, and a count not known.
  for (const auto& [registers, least] :
       {std::pair{168, 168}, {128, 128}, {240, 136}, {255, 168}, {-1, 168}}) {
    info.registers = registers;
    INFO(registers << " registers, " << least << " claimed");
    CHECK_NOTHROW(detail::require_launch_registers(info, least, "the mma kernel"));
  }
  info.registers = 122;  // NVRTC's --Ofast-compile=mid gave this (bench/RESULTS.md, run 66)
  test::check_refusal(
      test::refusal([&] { detail::require_launch_registers(info, 168, "the mma kernel"); }),
      ErrorCategory::unsupported,
      {"forward_tma", "(nvrtc 13.0) with 122 registers a thread", "claims 168 a thread",
       "wait forever", "use the mma kernel"});
}

// The decode problems the tests run: every head dim they take, contiguous and paged, from one
// query row per kv head to 128.
std::vector<DecodeProblem> decode_problems() {
  std::vector<DecodeProblem> problems;
  for (const auto& [dim, dim_v] :
       {std::pair{64, 64}, {72, 72}, {128, 128}, {192, 128}, {256, 256}}) {
    for (bool paged : {false, true}) {
      for (int rows : {1, 4, 8, 16, 32, 64, 128}) {
        problems.push_back({.head_dim = dim,
                            .head_dim_v = dim_v,
                            .rows_per_kv_head = rows,
                            .paged = paged,
                            .batch = 1,
                            .heads_kv = 8,
                            .capacity = 32768});
      }
    }
  }
  return problems;
}

std::string describe(const DecodeProblem& p, const DecodeConfig& c) {
  return fmt::format("d {}/{}, {} rows, paged {}: warps {}, stages {}, m_tiles {}", p.head_dim,
                     p.head_dim_v, p.rows_per_kv_head, p.paged, c.warps, c.stages, c.m_tiles);
}

TEST_CASE("decode plans within each target's shared memory per CTA", "[decode][plan]") {
  // Each target's opt-in limit, as a device of it reports it; prefill's configs fit them too.
  for (const auto& [target, limit] : {std::pair{"sm_80", 163 * 1024},
                                      {"sm_86", 99 * 1024},
                                      {"sm_89", 99 * 1024},
                                      {"sm_90a", 227 * 1024}}) {
    INFO(target);
    REQUIRE(Target(target).max_shared_bytes_per_block() == limit);
    const DeviceInfo device = device_with(1024, limit);
    for (const DecodeProblem& p : decode_problems()) {
      const DecodeConfig config = choose(p, target, 132);
      INFO(describe(p, config));
      CHECK(config.stages >= 2);
      CHECK(detail::decode_attention_plan(p, config).shared_bytes <= limit);
      const Target planned(target);
      CHECK_NOTHROW(detail::require_fits(detail::decode_plan(p, config), config, &planned, device));
    }
    for (const int dim : {64, 128, 256}) {
      for (const bool band : {false, true}) {
        const AttentionProblem p{.head_dim = dim, .head_dim_v = dim, .band = band};
        CHECK_FALSE(detail::exceeded_limit(detail::attention_plan(p, choose(p, target)), device));
      }
    }
  }
  // Where 99 KiB is all a CTA gets, d128 takes two stages, and d256 two warps of two stages
  // (four warps would need 136 KiB).
  const DecodeProblem d128{.head_dim = 128, .head_dim_v = 128, .rows_per_kv_head = 8};
  CHECK(choose(d128, "sm_86", 84).stages == 2);
  CHECK(choose(d128, "sm_120", 84).stages == 2);
  const DecodeProblem d256{.head_dim = 256, .head_dim_v = 256, .rows_per_kv_head = 8};
  const DecodeConfig narrow = choose(d256, "sm_89", 128);
  CHECK(narrow.warps == 2);
  CHECK(narrow.stages == 2);
  CHECK(choose(d256, "sm_80", 108).warps == 4);
}

TEST_CASE("decode's choice for H100 (sm_90a) is the one made before plans knew the target",
          "[decode][plan]") {
  // Head dims, rows per kv head, paged, sequences, keys each holds; the config (splits on 132
  // SMs). d256 takes 136 KiB, past the 112 a CTA aims at: two stages are the fewest.
  const auto problem = [](int dim, int dim_v, int rows, bool paged, int batch, long long keys) {
    return DecodeProblem{.head_dim = dim,
                         .head_dim_v = dim_v,
                         .rows_per_kv_head = rows,
                         .paged = paged,
                         .batch = batch,
                         .heads_kv = 8,
                         .capacity = keys};
  };
  const auto config = [](int splits, int stages, int m_tiles) {
    return DecodeConfig{.num_splits = splits, .stages = stages, .m_tiles = m_tiles};
  };
  for (const auto& [p, want] : {std::pair{problem(64, 64, 4, false, 1, 32768), config(16, 4, 1)},
                                {problem(64, 64, 64, false, 8, 8192), config(2, 4, 4)},
                                {problem(72, 72, 8, true, 64, 4096), config(1, 4, 1)},
                                {problem(128, 128, 4, false, 1, 32768), config(16, 3, 1)},
                                {problem(128, 128, 32, true, 8, 8192), config(2, 3, 2)},
                                {problem(128, 128, 128, false, 1, 32768), config(4, 3, 2)},
                                {problem(192, 128, 16, true, 1, 32768), config(16, 2, 1)},
                                {problem(256, 256, 8, false, 1, 32768), config(16, 2, 1)},
                                {problem(256, 256, 64, true, 64, 4096), config(1, 2, 1)}}) {
    const DecodeConfig got = choose(p, "sm_90a", 132);
    INFO(describe(p, got));
    CHECK(got.num_splits == want.num_splits);
    CHECK(got.block_n == 16);
    CHECK(got.warps == 4);
    CHECK(got.stages == want.stages);
    CHECK(got.m_tiles == want.m_tiles);
  }
}

}  // namespace
}  // namespace kiln
