// SPDX-License-Identifier: Apache-2.0
// Runtime benchmarks: cold compile, first launch from a disk hit, memory-hit dispatch overhead
// over a raw cuLaunchKernel, and warm-up throughput by thread count.
//
//   kiln_bench_runtime cold CACHE            compile times of fresh specs (no GPU needed)
//   kiln_bench_runtime first-launch CACHE    run twice: the second, fresh process times a disk
//                                            hit through load and launch
//   kiln_bench_runtime dispatch CACHE        host time per launch, kiln vs cuLaunchKernel
//   kiln_bench_runtime warmup CACHE          the default specs at 1, 2, 4, 8 and 16 threads
//   kiln_bench_runtime decode CACHE          host time per kiln::attention_with_kvcache call
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}
void check(CUresult status, const char* what) {
  if (status != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(status, &name);
    throw std::runtime_error(std::string(what) + ": " + (name ? name : "?"));
  }
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

kiln::Options options_for(const fs::path& cache) {
  kiln::Options options;
  options.cache_dir = cache;
  options.kernels_dir = fs::path(KILN_SOURCE_DIR) / "kernels_src";
  return options;
}

kiln::KernelSpec bench_spec() {
  return kiln::unary_spec(kiln::UnaryOp::silu, kiln::DType::bf16, {256, 4});
}

// Cold compiles: each spec new to an empty cache; sm_90a and gfx90a, no GPU needed.
int cold(const fs::path& cache) {
  std::printf("%-8s %-10s %10s %10s\n", "target", "dtype", "compile_ms", "wall_ms");
  for (const char* target : {"sm_90a", "gfx90a"}) {
    auto options = options_for(cache / target);
    options.target = target;
    kiln::Runtime rt(options);
    for (kiln::DType dtype : {kiln::DType::f32, kiln::DType::bf16}) {
      const auto start = Clock::now();
      const kiln::KernelInfo info =
          rt.compile(kiln::unary_spec(kiln::UnaryOp::gelu, dtype, {256, 4}));
      std::printf("%-8s %-10s %10.1f %10.1f\n", target, std::string(kiln::to_string(dtype)).c_str(),
                  info.compile_ms, ms_since(start));
    }
  }
  return 0;
}

// The driver's context is made first, so the timing is kiln's: key, disk read, verify, load.
int first_launch(const fs::path& cache) {
  check(cudaFree(nullptr), "cudaFree(0)");
  void* buffer = nullptr;
  check(cudaMalloc(&buffer, 1 << 20), "cudaMalloc");
  const auto start = Clock::now();
  kiln::Runtime rt(options_for(cache));
  const auto constructed = Clock::now();
  kiln::unary({.op = kiln::UnaryOp::silu,
               .dtype = kiln::DType::bf16,
               .in = buffer,
               .out = buffer,
               .n = 1 << 19},
              {256, 4}, rt);
  const auto launched = Clock::now();
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  const kiln::Stats stats = rt.stats();
  std::printf(
      "first launch: runtime %.3f ms, kernel() + launch %.3f ms, until done %.3f ms "
      "(disk hits %llu, compiles %llu)\n",
      std::chrono::duration<double, std::milli>(constructed - start).count(),
      std::chrono::duration<double, std::milli>(launched - constructed).count(),
      ms_since(constructed), static_cast<unsigned long long>(stats.disk_hits),
      static_cast<unsigned long long>(stats.compiles));
  check(cudaFree(buffer), "cudaFree");
  return stats.compiles == 0 ? 0 : 3;
}

// Host time to enqueue a launch, in batches that the GPU drains between timings.
int dispatch(const fs::path& cache) {
  check(cudaFree(nullptr), "cudaFree(0)");
  auto options = options_for(cache);
  options.dump_dir = cache / "dump";
  kiln::Runtime rt(options);
  const kiln::KernelSpec spec = bench_spec();
  const kiln::Kernel warm = rt.kernel(spec);
  // The same cubin, loaded by hand, for the raw baseline.
  const fs::path cubin = cache / "dump" / (warm.info().key + ".cubin");
  if (!fs::exists(cubin)) {
    throw std::runtime_error("no dumped cubin at " + cubin.string() + ": clear the cache first");
  }
  std::ifstream in(cubin, std::ios::binary);
  const std::vector<char> image((std::istreambuf_iterator<char>(in)), {});
  CUmodule module;
  CUfunction function;
  check(cuModuleLoadData(&module, image.data()), "cuModuleLoadData");
  check(cuModuleGetFunction(&function, module, warm.info().lowered_name.c_str()),
        "cuModuleGetFunction");

  void* buffer = nullptr;
  check(cudaMalloc(&buffer, 4096), "cudaMalloc");
  struct {
    const void* in;
    void* out;
    long long n;
  } params{buffer, buffer, 64};
  constexpr int kBatch = 256, kRounds = 200;
  std::vector<double> raw_us, kiln_us, kiln_handle_us;
  for (int round = 0; round < kRounds; ++round) {
    auto start = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      void* args[] = {&params};
      check(cuLaunchKernel(function, 1, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr),
            "cuLaunchKernel");
    }
    raw_us.push_back(ms_since(start) * 1000.0 / kBatch);
    check(cudaDeviceSynchronize(), "sync");
    start = Clock::now();
    for (int i = 0; i < kBatch; ++i) {
      rt.kernel(spec).launch({.grid = {1}, .block = {256}}, params);
    }
    kiln_us.push_back(ms_since(start) * 1000.0 / kBatch);
    check(cudaDeviceSynchronize(), "sync");
    start = Clock::now();
    for (int i = 0; i < kBatch; ++i) warm.launch({.grid = {1}, .block = {256}}, params);
    kiln_handle_us.push_back(ms_since(start) * 1000.0 / kBatch);
    check(cudaDeviceSynchronize(), "sync");
  }
  check(cudaGetLastError(), "launches");
  const double raw = median(raw_us), lookup = median(kiln_us), handle = median(kiln_handle_us);
  std::printf(
      "dispatch per launch (median of %d batches of %d): raw cuLaunchKernel %.3f us, "
      "kiln rt.kernel(spec).launch %.3f us (+%.3f us), kiln Kernel::launch %.3f us "
      "(+%.3f us)\n",
      kRounds, kBatch, raw, lookup, lookup - raw, handle, handle - raw);
  check(cuModuleUnload(module), "cuModuleUnload");
  check(cudaFree(buffer), "cudaFree");
  return 0;
}

// Host time of a whole decode step through the C++ API (validation, config, spec, lookup,
// scratch and launch), bf16, 32 query heads on 8 kv heads, d 128, 4096 cached keys, batch 1
// (split-KV: scratch and a tag) and 32 (no split); compare dispatch's raw cuLaunchKernel.
int decode(const fs::path& cache) {
  check(cudaFree(nullptr), "cudaFree(0)");
  kiln::Runtime rt(options_for(cache));
  for (const int batch : {1, 32}) {
    constexpr int kLength = 4096, kHeads = 32, kHeadsKv = 8, kDim = 128;
    const std::size_t cache_bytes = std::size_t{2} * batch * kLength * kHeadsKv * kDim;
    void *q, *k, *v, *out, *seqlens;
    for (void** buffer : {&q, &out}) check(cudaMalloc(buffer, 2 * batch * kHeads * kDim), "q");
    for (void** buffer : {&k, &v}) {
      check(cudaMalloc(buffer, cache_bytes), "cache");
      check(cudaMemset(*buffer, 0x3c, cache_bytes), "cache");  // bf16 0.0115: finite values
    }
    check(cudaMemset(q, 0x3c, 2 * batch * kHeads * kDim), "q");
    check(cudaMalloc(&seqlens, 4 * batch), "seqlens");
    const std::vector<int> lengths(static_cast<std::size_t>(batch), kLength);
    check(cudaMemcpy(seqlens, lengths.data(), 4 * lengths.size(), cudaMemcpyHostToDevice),
          "seqlens");
    using kiln::DType;
    using kiln::TensorView;
    const kiln::KVCache kv{
        .k = TensorView::contiguous(k, DType::bf16, {batch, kLength, kHeadsKv, kDim}),
        .v = TensorView::contiguous(v, DType::bf16, {batch, kLength, kHeadsKv, kDim}),
        .seqlens = TensorView::contiguous(seqlens, DType::i32, {batch})};
    const TensorView q_view = TensorView::contiguous(q, DType::bf16, {batch, 1, kHeads, kDim});
    const TensorView out_view = TensorView::contiguous(out, DType::bf16, {batch, 1, kHeads, kDim});
    const auto step = [&] { kiln::attention_with_kvcache(q_view, kv, out_view, {}, nullptr, rt); };
    step();
    check(cudaDeviceSynchronize(), "sync");
    constexpr int kBatch = 64, kRounds = 100;
    std::vector<double> us;
    for (int round = 0; round < kRounds; ++round) {
      const auto start = Clock::now();
      for (int i = 0; i < kBatch; ++i) step();
      us.push_back(ms_since(start) * 1000.0 / kBatch);
      check(cudaDeviceSynchronize(), "sync");
    }
    std::printf("decode step, batch %d x %d keys: %.3f us a call (median of %d batches of %d)\n",
                batch, kLength, median(us), kRounds, kBatch);
    for (void* buffer : {q, k, v, out, seqlens}) check(cudaFree(buffer), "cudaFree");
  }
  return 0;
}

// Warm-up of the default specs into an empty cache, for sm_90a, at several thread counts.
int warmup(const fs::path& cache) {
  const std::vector<kiln::KernelSpec> specs = kiln::default_specs("sm_90a");
  std::printf("%8s %8s %10s %12s\n", "threads", "specs", "wall_ms", "compile_ms");
  for (int threads : {1, 2, 4, 8, 16}) {
    // Appended, not "t" + std::to_string(): g++ 12 warns falsely (-Wrestrict) on that at -O2.
    std::string name = "t";
    name += std::to_string(threads);
    auto options = options_for(cache / name);
    options.target = "sm_90a";
    kiln::Runtime rt(options);
    const kiln::WarmupReport report = rt.warmup(specs, {.threads = threads, .load = false});
    if (!report.ok()) throw std::runtime_error("warm-up failed");
    std::printf("%8d %8zu %10.0f %12.0f\n", threads, specs.size(), report.wall_ms,
                rt.stats().compile_ms);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s cold|first-launch|dispatch|decode|warmup CACHE_DIR\n", argv[0]);
    return 2;
  }
  try {
    const std::string mode = argv[1];
    const fs::path cache = argv[2];
    if (mode == "cold") return cold(cache);
    if (mode == "first-launch") return first_launch(cache);
    if (mode == "dispatch") return dispatch(cache);
    if (mode == "decode") return decode(cache);
    if (mode == "warmup") return warmup(cache);
    std::fprintf(stderr, "unknown mode '%s'\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln_bench_runtime: %s\n", e.what());
    return 1;
  }
}
