// SPDX-License-Identifier: Apache-2.0
// Catch2 entry point. `--require-gpu` makes a run with no usable GPU exit 77, which ctest
// reports as skipped, after printing why.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <string_view>
#include <vector>

#include "support.hpp"

int main(int argc, char** argv) {
  std::vector<char*> args;
  bool require_gpu = false;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--require-gpu") {
      require_gpu = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  if (require_gpu) {
    if (auto reason = kiln::test::gpu_unavailable_reason()) {
      std::printf("skipped: the [gpu] tests need a GPU: %s\n", reason->c_str());
      return 77;
    }
  }
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
