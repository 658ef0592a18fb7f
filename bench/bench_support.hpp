// SPDX-License-Identifier: Apache-2.0
// What the C++ tuning benchmarks share: CUDA status checks, device buffers, random inputs drawn
// from a fixed seed (not all zeros), and a median of timed calls.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::bench {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

// Uniform values in [-1, 1) from `seed`, one per element, as floats.
inline std::vector<float> random_uniform(std::size_t count, std::uint64_t seed) {
  std::vector<float> values(count);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& value : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    value = static_cast<float>(state >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f;
  }
  return values;
}

// bf16 bits of the floats, truncated (the values are exactly what the device reads).
inline std::vector<std::uint16_t> random_bf16(std::size_t count, std::uint64_t seed) {
  std::vector<std::uint16_t> bits(count);
  const std::vector<float> values = random_uniform(count, seed);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint32_t word;
    std::memcpy(&word, &values[i], sizeof word);
    bits[i] = static_cast<std::uint16_t>(word >> 16);
  }
  return bits;
}

// e4m3 codes of values in (-2, 2): every finite code with an exponent below 8 (no NaN, 0x7f and
// 0xff, can occur).
inline std::vector<std::uint8_t> random_e4m3(std::size_t count, std::uint64_t seed) {
  std::vector<std::uint8_t> codes(count);
  const std::vector<float> values = random_uniform(count, seed);
  for (std::size_t i = 0; i < count; ++i) {
    const auto magnitude = static_cast<std::uint8_t>(std::abs(values[i]) * 64.0f);  // 0 .. 63
    codes[i] = static_cast<std::uint8_t>((values[i] < 0 ? 0x80 : 0) | magnitude);
  }
  return codes;
}

inline float bf16_to_float(std::uint16_t value) {
  const std::uint32_t bits = std::uint32_t{value} << 16;
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// The largest |got - expected| over bf16 outputs; infinity where either is NaN.
inline float max_abs_diff_bf16(const std::vector<std::uint16_t>& got,
                               const std::vector<std::uint16_t>& expected) {
  float most = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float diff = std::fabs(bf16_to_float(got[i]) - bf16_to_float(expected[i]));
    most = std::isnan(diff) ? INFINITY : std::max(most, diff);
  }
  return most;
}

// A device copy of a host vector, freed with the object.
struct Device {
  void* data = nullptr;
  template <typename T>
  explicit Device(const std::vector<T>& host) {
    check(cudaMalloc(&data, host.size() * sizeof(T)), "cudaMalloc");
    check(cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  ~Device() { cudaFree(data); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  template <typename T>
  std::vector<T> read(std::size_t count) const {
    std::vector<T> host(count);
    check(cudaMemcpy(host.data(), data, count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return host;
  }
};

// The median of `reps` timings of call(rep), in milliseconds, each between two events on the
// default stream.
template <typename Call>
double median_ms(int reps, Call&& call) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    check(cudaEventRecord(start), "cudaEventRecord");
    call(rep);
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    times.push_back(ms);
  }
  check(cudaEventDestroy(start), "cudaEventDestroy");
  check(cudaEventDestroy(stop), "cudaEventDestroy");
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace kiln::bench
