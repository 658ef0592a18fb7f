// SPDX-License-Identifier: Apache-2.0
// choose()'s configs for a grid of problems and targets, and the specs built from them, pinned in
// choose_pins.txt: the tuning tables change speed only, so a change to what choose() picks must
// be deliberate.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "kiln/kiln.hpp"
#include "ops/every_feature.hpp"

namespace kiln {
namespace {

std::string_view name_of(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::mma: return "mma";
    case AttentionKernel::wgmma: return "wgmma";
    case AttentionKernel::tma: return "tma";
    case AttentionKernel::portable: return "portable";
  }
  return "?";
}

// One line per target, head dims and mask: the config for each key count.
std::vector<std::string> attention_lines() {
  std::vector<std::string> lines;
  for (const char* target :
       {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120", "gfx90a", "gfx942"}) {
    for (const auto& [dim, dim_v] : {std::pair{32, 32},
                                     {56, 56},
                                     {64, 64},
                                     {64, 128},
                                     {80, 80},
                                     {96, 96},
                                     {128, 128},
                                     {128, 64},
                                     {192, 128},
                                     {192, 192},
                                     {256, 256}}) {
      for (const bool band : {false, true}) {
        std::string line = fmt::format("attention {} d{}/{} band {}:", target, dim, dim_v, band);
        for (const long long keys : {0LL, kLongSeqlenK - 1, kLongSeqlenK, 8 * kLongSeqlenK}) {
          const AttentionProblem problem{
              .head_dim = dim, .head_dim_v = dim_v, .band = band, .seqlen_k = keys};
          const AttentionConfig c = choose(problem, target);
          line += fmt::format(" k{} {} {}x{} w{} s{};", keys, name_of(c.kernel), c.block_m,
                              c.block_n, c.warps, c.stages);
        }
        lines.push_back(line);
      }
    }
  }
  // e4m3 k and v, on the targets that read fp8.
  for (const char* target : {"sm_89", "sm_90a", "sm_120"}) {
    for (const auto& [dim, dim_v] :
         {std::pair{64, 64}, {80, 80}, {128, 128}, {192, 128}, {256, 256}}) {
      for (const bool band : {false, true}) {
        std::string line =
            fmt::format("attention {} e4m3 d{}/{} band {}:", target, dim, dim_v, band);
        for (const long long keys : {0LL, kLongSeqlenK}) {
          const AttentionProblem problem{.dtype_kv = DType::e4m3,
                                         .head_dim = dim,
                                         .head_dim_v = dim_v,
                                         .band = band,
                                         .seqlen_k = keys};
          const AttentionConfig c = choose(problem, target);
          line += fmt::format(" k{} {} {}x{} w{} s{};", keys, name_of(c.kernel), c.block_m,
                              c.block_n, c.warps, c.stages);
        }
        lines.push_back(line);
      }
    }
  }
  return lines;
}

// One line per target, head dims and query rows per kv head: the config for each batch, cache
// capacity, SM count and requested split count.
std::vector<std::string> decode_lines() {
  std::vector<std::string> lines;
  for (const char* target : {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_120"}) {
    for (const auto& [dim, dim_v] :
         {std::pair{64, 64}, {72, 72}, {128, 128}, {192, 128}, {256, 128}, {256, 256}}) {
      for (const int rows : {1, 8, 16, 32, 64, 128}) {
        std::string line = fmt::format("decode {} d{}/{} rows {}:", target, dim, dim_v, rows);
        for (const auto& [batch, capacity] :
             {std::pair{1, 16LL}, {1, 32768LL}, {8, 8192LL}, {64, 4096LL}}) {
          for (const int sms : {84, 132}) {
            for (const int requested : {0, 3}) {
              const DecodeProblem problem{.head_dim = dim,
                                          .head_dim_v = dim_v,
                                          .rows_per_kv_head = rows,
                                          .batch = batch,
                                          .heads_kv = 8,
                                          .capacity = capacity,
                                          .requested_splits = requested};
              const DecodeConfig c = choose(problem, target, sms);
              line += fmt::format(" b{} k{} sm{} r{}: {} {} {} {} {};", batch, capacity, sms,
                                  requested, c.num_splits, c.block_n, c.warps, c.stages, c.m_tiles);
            }
          }
        }
        lines.push_back(line);
      }
    }
  }
  return lines;
}

// The specs of kiln warm's default set for each kind of target, and of each attention kernel with
// every feature on: what the families build from choose()'s configs.
std::vector<std::string> spec_lines() {
  std::vector<std::string> lines;
  for (const char* target : {"sm_80", "sm_90a", "gfx90a"}) {
    for (const KernelSpec& spec : default_specs(target)) {
      lines.push_back(fmt::format("spec {}: {}", target, to_string(spec)));
    }
  }
  const AttentionProblem all = test::every_attention_feature();
  for (const AttentionKernel kernel : {AttentionKernel::mma, AttentionKernel::wgmma,
                                       AttentionKernel::tma, AttentionKernel::portable}) {
    lines.push_back(fmt::format("spec {}: {}", name_of(kernel),
                                to_string(attention_spec(all, {.kernel = kernel}))));
  }
  const DecodeProblem decode{.head_dim = 128,
                             .head_dim_v = 64,
                             .paged = true,
                             .band = true,
                             .softcap = true,
                             .alibi = true,
                             .append = true,
                             .rotary = true};
  for (const KernelSpec& spec : decode_specs(decode, {})) {
    lines.push_back(fmt::format("spec decode: {}", to_string(spec)));
  }
  return lines;
}

// The pinned lines: choose_pins.txt less its comments.
std::vector<std::string> pinned_lines() {
  std::ifstream file(std::string(KILN_SOURCE_DIR) + "/tests/ops/choose_pins.txt");
  REQUIRE(file);
  std::vector<std::string> lines;
  for (std::string line; std::getline(file, line);) {
    if (!line.empty() && !line.starts_with('#')) lines.push_back(line);
  }
  return lines;
}

TEST_CASE("choose() gives the pinned configs and specs for every problem and target of the grid",
          "[attention][decode][plan]") {
  std::vector<std::string> got = attention_lines();
  for (std::string& line : decode_lines()) got.push_back(std::move(line));
  for (std::string& line : spec_lines()) got.push_back(std::move(line));
  const std::vector<std::string> pinned = pinned_lines();
  if (got != pinned) {
    const std::filesystem::path path =
        std::filesystem::temp_directory_path() / "kiln_choose_pins.got.txt";
    std::ofstream file(path);
    for (const std::string& line : got) file << line << '\n';
    WARN("choose()'s lines differ from choose_pins.txt; all of them are in "
         << path.string() << ": bench what changed, then copy them over the pinned lines");
  }
  REQUIRE(got.size() == pinned.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("pinned: " << pinned[i]);
    CHECK(got[i] == pinned[i]);
  }
}

}  // namespace
}  // namespace kiln
