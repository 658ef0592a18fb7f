// SPDX-License-Identifier: Apache-2.0
// kiln_warmup_with: its sized options and the progress callback each kernel reports to.
#include <catch2/catch.hpp>

#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

// A device ordinal no other test warms, so that its process-wide runtime is built here, from
// the environment this test sets.
constexpr int kDevice = 11;

struct Seen {
  std::vector<std::size_t> done;
  std::size_t total = 0;
  std::vector<std::string> specs;
  std::size_t failed = 0;
};

void record(void* user, std::size_t done, std::size_t total, const char* spec, double ms, int ok) {
  Seen& seen = *static_cast<Seen*>(user);
  seen.done.push_back(done);
  seen.total = total;
  seen.specs.emplace_back(spec);
  CHECK(ms >= 0);
  if (!ok) ++seen.failed;
}

TEST_CASE("kiln_warmup_with reports each kernel to its progress callback, in order", "[capi]") {
  // Nothing compiles (KILN_JIT=off and an empty cache), so that each kernel fails at once: the
  // callback hears of failures as of successes.
  const TempDir cache;
  const ScopedEnv dir("KILN_CACHE_DIR", cache.path().c_str());
  const ScopedEnv jit("KILN_JIT", "off");
  Seen seen;
  kiln_warmup_options options;
  kiln_warmup_options_init(&options);
  CHECK(options.struct_size == sizeof(kiln_warmup_options));
  CHECK(options.progress == nullptr);
  options.target = "sm_90a";
  options.threads = 3;
  options.progress = record;
  options.progress_user = &seen;
  CHECK(kiln_warmup_with(kDevice, &options) != KILN_OK);
  const std::size_t total = default_specs(Target("sm_90a")).size();
  CHECK(seen.total == total);
  REQUIRE(seen.done.size() == total);
  for (std::size_t i = 0; i < total; ++i) CHECK(seen.done[i] == i + 1);
  CHECK(seen.failed == total);
  CHECK_THAT(seen.specs.front(), Catch::Contains(".cuh:kiln::") && Catch::EndsWith(" @sm_90a"));

  // An older kiln.h's struct, which ends before the callback, warms without progress.
  options.struct_size = offsetof(kiln_warmup_options, threads) + sizeof options.threads;
  seen = {};
  CHECK(kiln_warmup_with(kDevice, &options) != KILN_OK);
  CHECK(seen.done.empty());

  options.struct_size = 0;
  CHECK(kiln_warmup_with(kDevice, &options) == KILN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(kiln_last_error(), Catch::Contains("options->struct_size is 0") &&
                                    Catch::Contains("kiln_warmup_options_init(options)"));
}

}  // namespace
}  // namespace kiln::test
