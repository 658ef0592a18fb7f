// SPDX-License-Identifier: Apache-2.0
// The README's example: y = gelu(x) on the GPU through kiln, checked against a CPU reference.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kiln/kiln.hpp"

int main() try {
  const std::int64_t n = (1 << 20) + 3;
  std::vector<float> x(n), y(n, NAN);
  std::mt19937 rng(2026);
  std::uniform_real_distribution<float> dist(-4.f, 4.f);
  for (float& v : x) v = dist(rng);

  void *dx = nullptr, *dy = nullptr;
  if (cudaMalloc(&dx, n * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&dy, n * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "demo: cudaMalloc failed: is there a GPU?\n");
    return 1;
  }
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(dy, 0xFF, n * sizeof(float));  // poison: NaN until written

  // The first call compiles (or finds the kernel in the disk cache); later calls hit memory.
  kiln::unary({.op = kiln::UnaryOp::gelu, .dtype = kiln::DType::f32, .in = dx, .out = dy, .n = n});
  if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) {
    std::fprintf(stderr, "demo: the kernel failed\n");
    return 1;
  }
  cudaMemcpy(y.data(), dy, n * sizeof(float), cudaMemcpyDeviceToHost);

  // Float gelu loses relative precision where 1 + erf(x) cancels (x near -4), so the error is
  // measured against 1e-6 in absolute terms plus 1e-5 relative, as the tests do.
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double ref = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
    const double err = std::fabs(y[i] - ref) / (1e-6 + 1e-5 * std::fabs(ref));
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  const kiln::Stats stats = kiln::default_runtime().stats();
  std::printf(
      "gelu over %lld floats on %s: worst error %.2f of the tolerance (%s); compiles "
      "%llu, disk hits %llu, compile %.0f ms\n",
      static_cast<long long>(n), kiln::default_runtime().target().name().c_str(), worst,
      worst <= 1 ? "ok" : "FAILED", static_cast<unsigned long long>(stats.compiles),
      static_cast<unsigned long long>(stats.disk_hits), stats.compile_ms);
  cudaFree(dx);
  cudaFree(dy);
  return worst <= 1 ? 0 : 1;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "demo: %s\n", e.what());
  return 1;
}
