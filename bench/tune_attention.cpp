// SPDX-License-Identifier: Apache-2.0
// Times candidate configs of the forward kernels against choose()'s, on bench/attention.py's
// shapes, to fill choose()'s tuning table from measurements. Each candidate's output is checked
// against choose()'s on the same inputs (random, never zeros); a mismatch fails the run.
//
//   kiln_bench_tune [CACHE]      one line per shape: ms per call for each config, and the best
//
// Needs a GPU; the kernels compile into CACHE (default: a directory under /tmp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

namespace fs = std::filesystem;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

struct Shape {
  int head_dim, seqlen, batch, heads, heads_kv;
  bool causal;
};

// bench/attention.py's bf16 rows.
const Shape kShapes[] = {
    {64, 1024, 16, 32, 32, false},  {64, 1024, 16, 32, 32, true},   {64, 4096, 4, 32, 32, false},
    {64, 4096, 4, 32, 32, true},    {64, 16384, 1, 32, 32, false},  {64, 16384, 1, 32, 32, true},
    {128, 1024, 16, 16, 16, false}, {128, 1024, 16, 16, 16, true},  {128, 4096, 4, 16, 16, false},
    {128, 4096, 4, 16, 16, true},   {128, 16384, 1, 16, 16, false}, {128, 16384, 1, 16, 16, true},
    {256, 1024, 16, 8, 8, false},   {256, 1024, 16, 8, 8, true},    {256, 4096, 4, 8, 8, false},
    {256, 4096, 4, 8, 8, true},     {128, 8192, 1, 32, 8, true},    {128, 512, 32, 32, 8, true},
    {80, 2048, 4, 32, 32, true},    {96, 4096, 2, 32, 32, true},
};

// The tma kernel's candidates by head dim; those the shared memory cannot hold fail to compile
// and are reported as such.
std::vector<kiln::AttentionConfig> candidates(int head_dim) {
  constexpr kiln::AttentionKernel tma = kiln::AttentionKernel::tma;
  const auto config = [](int m, int n, int stages) {
    return kiln::AttentionConfig{.block_m = m, .block_n = n, .stages = stages, .kernel = tma};
  };
  if (head_dim <= 64) {
    return {config(128, 128, 2), config(192, 128, 2), config(128, 176, 2), config(128, 192, 2),
            config(192, 128, 3)};
  }
  if (head_dim <= 128) {
    return {config(128, 128, 2), config(128, 128, 3), config(128, 176, 2)};
  }
  return {config(128, 64, 2), config(64, 64, 2)};
}

// Random bf16 values in [-1, 1) from a fixed seed.
std::vector<std::uint16_t> random_bf16(std::size_t count, std::uint64_t seed) {
  std::vector<std::uint16_t> values(count);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& value : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float x = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    value = static_cast<std::uint16_t>(bits >> 16);
  }
  return values;
}

float bf16_to_float(std::uint16_t value) {
  const std::uint32_t bits = std::uint32_t{value} << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

struct Device {
  void* data = nullptr;
  explicit Device(const std::vector<std::uint16_t>& host) {
    check(cudaMalloc(&data, host.size() * 2), "cudaMalloc");
    check(cudaMemcpy(data, host.data(), host.size() * 2, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  ~Device() { cudaFree(data); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
};

std::string name(const kiln::AttentionConfig& c) {
  return std::to_string(c.block_m) + "x" + std::to_string(c.block_n) + "s" +
         std::to_string(c.stages);
}

int run(const fs::path& cache) {
  kiln::Options options;
  options.cache_dir = cache;
  options.kernels_dir = fs::path(KILN_SOURCE_DIR) / "kernels_src";
  kiln::Runtime runtime(options);
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  int mismatches = 0;
  for (const Shape& s : kShapes) {
    const std::int64_t q_count = std::int64_t{s.batch} * s.seqlen * s.heads * s.head_dim;
    const std::int64_t kv_count = std::int64_t{s.batch} * s.seqlen * s.heads_kv * s.head_dim;
    const Device q(random_bf16(q_count, 1)), k(random_bf16(kv_count, 2)),
        v(random_bf16(kv_count, 3));
    const Device out(std::vector<std::uint16_t>(q_count, 0xffff));  // NaN until written
    const auto view = [&](const Device& d, int heads) {
      return kiln::TensorView::contiguous(d.data, kiln::DType::bf16,
                                          {s.batch, s.seqlen, heads, s.head_dim});
    };
    kiln::AttentionOptions attention_options;
    attention_options.score.causal = s.causal;
    const auto call = [&](const kiln::AttentionConfig& config) {
      kiln::attention(view(q, s.heads), view(k, s.heads_kv), view(v, s.heads_kv),
                      view(out, s.heads), attention_options, config, nullptr, runtime);
    };
    const auto result = [&] {
      std::vector<std::uint16_t> host(static_cast<std::size_t>(q_count));
      check(cudaMemcpy(host.data(), out.data, host.size() * 2, cudaMemcpyDeviceToHost),
            "cudaMemcpy");
      return host;
    };
    const kiln::AttentionProblem problem{
        .head_dim = s.head_dim, .head_dim_v = s.head_dim, .band = s.causal, .seqlen_k = s.seqlen};
    const kiln::AttentionConfig chosen = kiln::choose(problem, runtime.target());
    call(chosen);
    check(cudaDeviceSynchronize(), "the chosen config's run");
    const std::vector<std::uint16_t> expected = result();
    std::printf("d%-3d %5d x %-2d h%d/%d %-6s chosen %s |", s.head_dim, s.seqlen, s.batch, s.heads,
                s.heads_kv, s.causal ? "causal" : "none", name(chosen).c_str());
    double best_ms = 1e30;
    std::string best;
    for (const kiln::AttentionConfig& config : candidates(s.head_dim)) {
      try {
        call(config);
        check(cudaDeviceSynchronize(), "warm-up");
      } catch (const std::exception& e) {
        std::printf(" %s n/a |", name(config).c_str());
        continue;
      }
      float most = 0;
      const std::vector<std::uint16_t> got = result();
      for (std::size_t i = 0; i < got.size(); ++i) {
        const float diff = std::fabs(bf16_to_float(got[i]) - bf16_to_float(expected[i]));
        most = std::isnan(diff) ? INFINITY : std::max(most, diff);
      }
      std::vector<double> times;
      for (int rep = 0; rep < 20; ++rep) {
        check(cudaEventRecord(start), "cudaEventRecord");
        call(config);
        check(cudaEventRecord(stop), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        times.push_back(ms);
      }
      std::sort(times.begin(), times.end());
      const double ms = times[times.size() / 2];
      // Configs differ in summation order only: a few bf16 ulps of outputs below 1.
      const bool mismatch = !(most <= 1e-2f);
      mismatches += mismatch;
      std::printf(" %s %.3f%s |", name(config).c_str(), ms, mismatch ? " MISMATCH" : "");
      if (!mismatch && ms < best_ms) best_ms = ms, best = name(config);
    }
    std::printf(" best %s\n", best.c_str());
    std::fflush(stdout);
  }
  return mismatches == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? fs::path(argv[1]) : fs::temp_directory_path() / "kiln_bench_tune");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_tune: %s\n", e.what());
    return 2;
  }
}
