// SPDX-License-Identifier: Apache-2.0
// Uses an installed kiln: compiles a kernel for sm_90a from the installed kernel sources.
#include <kiln/kiln.hpp>

#include <cstdio>
#include <filesystem>

int main(int argc, char** argv) try {
  if (argc != 2) return 2;
  kiln::Options options;
  options.cache_dir = std::filesystem::path(argv[1]);
  options.target = "sm_90a";
  kiln::Runtime runtime(options);
  const kiln::KernelInfo info =
      runtime.compile(kiln::unary_spec(kiln::UnaryOp::exp, kiln::DType::f32, {256, 4}));
  std::printf("kernels from %s; compiled %s: %d registers\n", runtime.info().kernels_dir.c_str(),
              info.spec.c_str(), info.registers);
  return info.registers > 0 && !runtime.info().kernels_dir.empty() ? 0 : 1;
} catch (const kiln::Error& e) {
  std::fprintf(stderr, "consumer: %s\n", e.what());
  return 1;
}
