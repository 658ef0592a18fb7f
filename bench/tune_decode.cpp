// SPDX-License-Identifier: Apache-2.0
// Times candidate configs of the decode kernel against choose()'s, on bench/decode.py's shapes
// (32 query heads on 8 kv heads, head dim 128, one query per sequence) and over three caches:
// bf16, e4m3, and e4m3 paged by 16 keys a page (a random page order). Fills choose()'s decode
// tuning from measurements. Each candidate's output is checked against choose()'s on the same
// inputs (random, never zeros); a mismatch fails the run.
//
//   kiln_bench_tune_decode [CACHE]   per shape and cache: choose()'s config and its time, then
//                                    the fastest candidates, in TB/s of the cache's own bytes
//
// Calls alternate between two copies of the cache, so that a call never finds in L2 what the
// call before it read. Needs a GPU; the kernels compile into CACHE (default: under /tmp).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "kiln/kiln.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::bench::check;
using kiln::bench::Device;

constexpr int kHeads = 32, kHeadsKv = 8, kHeadDim = 128, kPageSize = 16;

struct Row {
  int batch, length;
};
// bench/decode.py's rows, and a short cache.
constexpr Row kRows[] = {{1, 32768}, {8, 8192}, {32, 4096}, {64, 16384}, {128, 2048}, {64, 1024}};

struct CacheKind {
  const char* name;
  kiln::DType dtype;
  bool paged;
};
constexpr CacheKind kKinds[] = {
    {"bf16", kiln::DType::bf16, false},
    {"e4m3", kiln::DType::e4m3, false},
    {"e4m3 p16", kiln::DType::e4m3, true},
};

// Tiles of 16 to 64 keys a warp, 2 to 8 stages, 4 warps (and 8 of 16-key tiles), each at
// choose()'s split count and twice it.
std::vector<kiln::DecodeConfig> candidates(const kiln::DecodeConfig& chosen) {
  std::vector<kiln::DecodeConfig> configs;
  for (int block_n : {16, 32, 64}) {
    for (int warps : {4, 8}) {
      if (warps == 8 && block_n > 16) continue;
      for (int stages : {2, 3, 4, 6, 8}) {
        for (int splits : {chosen.num_splits, chosen.num_splits * 2}) {
          configs.push_back({.num_splits = std::min(splits, 128),
                             .block_n = block_n,
                             .warps = warps,
                             .stages = stages,
                             .m_tiles = chosen.m_tiles});
        }
      }
    }
  }
  return configs;
}

std::string name(const kiln::DecodeConfig& c) {
  return "n" + std::to_string(c.block_n) + "w" + std::to_string(c.warps) + "s" +
         std::to_string(c.stages) + "x" + std::to_string(c.num_splits);
}

// A cache's K and V, one copy of each.
struct Cache {
  Device k, v;
};

Cache make_cache(const CacheKind& kind, std::size_t count, std::uint64_t seed) {
  if (kind.dtype == kiln::DType::bf16) {
    return {Device(kiln::bench::random_bf16(count, seed)),
            Device(kiln::bench::random_bf16(count, seed + 1))};
  }
  return {Device(kiln::bench::random_e4m3(count, seed)),
          Device(kiln::bench::random_e4m3(count, seed + 1))};
}

int run(const fs::path& cache_dir) {
  kiln::Options options;
  options.cache_dir = cache_dir;
  options.kernels_dir = fs::path(KILN_SOURCE_DIR) / "kernels_src";
  kiln::Runtime runtime(options);
  int device = 0, multiprocessors = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute");
  int mismatches = 0;
  for (const Row& row : kRows) {
    const std::size_t q_count = std::size_t(row.batch) * kHeads * kHeadDim;
    const std::size_t kv_count = std::size_t(row.batch) * row.length * kHeadsKv * kHeadDim;
    const Device q(kiln::bench::random_bf16(q_count, 1));
    const Device out(std::vector<std::uint16_t>(q_count, 0xffff));  // NaN until written
    const Device seqlens(std::vector<std::int32_t>(row.batch, row.length));
    const int pages_per_sequence = row.length / kPageSize;
    std::vector<std::int32_t> table(std::size_t(row.batch) * pages_per_sequence);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(7));
    const Device block_table(table);
    for (const CacheKind& kind : kKinds) {
      const Cache sets[] = {make_cache(kind, kv_count, 2), make_cache(kind, kv_count, 4)};
      const auto cache_view = [&](const Device& d) {
        return kind.paged ? kiln::TensorView::contiguous(
                                d.data, kind.dtype,
                                {row.batch * pages_per_sequence, kPageSize, kHeadsKv, kHeadDim})
                          : kiln::TensorView::contiguous(
                                d.data, kind.dtype, {row.batch, row.length, kHeadsKv, kHeadDim});
      };
      const auto call = [&](const kiln::DecodeConfig& config, int set) {
        kiln::KVCache cache{
            .k = cache_view(sets[set].k),
            .v = cache_view(sets[set].v),
            .seqlens = kiln::TensorView::contiguous(seqlens.data, kiln::DType::i32, {row.batch})};
        if (kind.paged) {
          cache.block_table = kiln::TensorView::contiguous(block_table.data, kiln::DType::i32,
                                                           {row.batch, pages_per_sequence});
        }
        const auto heads = [&](const Device& d) {
          return kiln::TensorView::contiguous(d.data, kiln::DType::bf16,
                                              {row.batch, 1, kHeads, kHeadDim});
        };
        kiln::attention_with_kvcache(heads(q), cache, heads(out), {}, config, nullptr, runtime);
      };
      const kiln::DecodeProblem problem{.dtype_kv = kind.dtype,
                                        .head_dim = kHeadDim,
                                        .head_dim_v = kHeadDim,
                                        .rows_per_kv_head = kHeads / kHeadsKv,
                                        .paged = kind.paged,
                                        .batch = row.batch,
                                        .heads_kv = kHeadsKv,
                                        .capacity = row.length};
      const kiln::DecodeConfig chosen = kiln::choose(problem, runtime.target(), multiprocessors);
      call(chosen, 0);
      check(cudaDeviceSynchronize(), "the chosen config's run");
      const std::vector<std::uint16_t> expected = out.read<std::uint16_t>(q_count);
      const double bytes = 2.0 * double(kv_count) * double(kiln::size_of(kind.dtype));
      const auto time = [&](const kiln::DecodeConfig& config) {
        return kiln::bench::median_ms(20, [&](int rep) { call(config, rep % 2); });
      };
      const auto tbps = [&](double ms) { return bytes / ms * 1e-9; };
      const double chosen_ms = time(chosen);
      std::vector<std::pair<double, std::string>> results;
      for (const kiln::DecodeConfig& config : candidates(chosen)) {
        try {
          call(config, 0);
          check(cudaDeviceSynchronize(), "warm-up");
        } catch (const kiln::Error&) {
          continue;  // more shared memory than a CTA may take
        }
        // Configs differ in summation order only: a few bf16 ulps of outputs below 1.
        if (!(kiln::bench::max_abs_diff_bf16(out.read<std::uint16_t>(q_count), expected) <=
              1e-2f)) {
          std::printf("MISMATCH %s\n", name(config).c_str());
          ++mismatches;
          continue;
        }
        results.emplace_back(time(config), name(config));
      }
      std::sort(results.begin(), results.end());
      std::printf("%3d x %-5d %-8s chosen %s %.3f ms %.2f TB/s | best:", row.batch, row.length,
                  kind.name, name(chosen).c_str(), chosen_ms, tbps(chosen_ms));
      for (std::size_t i = 0; i < std::min<std::size_t>(5, results.size()); ++i) {
        std::printf(" %s %.3f ms %.2f TB/s,", results[i].second.c_str(), results[i].first,
                    tbps(results[i].first));
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "kiln_bench_tune_decode");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_tune_decode: %s\n", e.what());
    return 2;
  }
}
