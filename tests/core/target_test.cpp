// SPDX-License-Identifier: Apache-2.0
// lib/core/target.cpp: kiln::Target, read once from a target's name wherever one comes in.
#include <catch2/catch.hpp>

#include <string>

#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.h"
#include "kiln/kiln.hpp"
#include "kiln/target.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

// The message of the Error naming `name` as no target.
std::string refusal(const std::string& name) {
  try {
    const Target target(name);
    FAIL(name << " parsed as " << target.name());
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::invalid_argument);
    return e.what();
  }
  return {};
}

}  // namespace

TEST_CASE("a target is parsed into its vendor, arch and arch-specific suffix", "[target]") {
  const Target hopper("sm_90a");
  CHECK(hopper.vendor() == Vendor::nvidia);
  CHECK(hopper.arch() == 90);
  CHECK(hopper.arch_specific());
  CHECK(hopper.backend() == "cuda");
  const Target ampere("sm_80");
  CHECK(ampere.arch() == 80);
  CHECK_FALSE(ampere.arch_specific());
  CHECK(Target("sm_100a").arch() == 100);
  const Target mi200("gfx90a");
  CHECK(mi200.vendor() == Vendor::amd);
  CHECK(mi200.arch() == 0x90a);
  CHECK_FALSE(mi200.arch_specific());
  CHECK(mi200.backend() == "hip");
  CHECK(Target("gfx1100").arch() == 0x1100);
  for (const char* name : {"sm_80", "sm_90", "sm_90a", "sm_120", "gfx90a", "gfx942", "gfx1100"}) {
    CHECK(Target(name).name() == name);
    CHECK(Target::parse(name) == Target(name));
  }
  CHECK(Target("sm_90") != Target("sm_90a"));
}

TEST_CASE("a name that is no target is refused, with the one it probably meant", "[target]") {
  for (const char* name : {"", "sm", "sm_", "sm_8", "sm_090", "sm_90b", "sm_-90", "sm_9O", "x86_64",
                           "gfx", "gfx90", "gfx90z", "gfx12345", "gfx-90a"}) {
    INFO(name);
    CHECK_FALSE(Target::parse(name));
    CHECK_THAT(refusal(name),
               Catch::StartsWith(std::string("target '") + name +
                                 "' names no GPU architecture "
                                 "(CUDA targets are sm_XY, such as sm_80 or sm_90a, HIP ones "
                                 "gfxN, such as gfx90a)"));
  }
  CHECK_THAT(refusal("sm90"), Catch::EndsWith("; did you mean sm_90 or sm_90a?"));
  CHECK_THAT(refusal("SM-80"), Catch::EndsWith("; did you mean sm_80?"));
  CHECK_THAT(refusal("compute_90"), Catch::EndsWith("; did you mean sm_90 or sm_90a?"));
  CHECK_THAT(refusal("sm90a"), Catch::EndsWith("; did you mean sm_90a?"));
  CHECK_THAT(refusal("GFX90A"), Catch::EndsWith("; did you mean gfx90a?"));
  // Nothing near: no suggestion, rather than one that is no target either.
  CHECK_THAT(refusal("sm_90b"), Catch::EndsWith("gfxN, such as gfx90a)"));
  CHECK_THAT(refusal("x86_64"), Catch::EndsWith("gfxN, such as gfx90a)"));
}

TEST_CASE("a backend's name is its vendor's, both ways", "[target]") {
  for (const Vendor vendor : {Vendor::nvidia, Vendor::amd}) {
    CHECK(parse_backend(to_string(vendor)) == vendor);
  }
  CHECK(to_string(Vendor::amd) == "hip");
  CHECK_FALSE(parse_backend("rocm").has_value());
  CHECK_FALSE(parse_backend("CUDA").has_value());
}

TEST_CASE("a target knows the shared memory one CTA may take on it", "[target]") {
  // CUDA's opt-in maximum, which a device of the target reports (the [gpu] run checks its own);
  // AMD's LDS per workgroup.
  for (const auto& [name, bytes] : {std::pair{"sm_80", 166912},
                                    {"sm_86", 101376},
                                    {"sm_87", 166912},
                                    {"sm_89", 101376},
                                    {"sm_90", 232448},
                                    {"sm_90a", 232448},
                                    {"sm_100a", 232448},
                                    {"sm_120", 101376},
                                    {"gfx90a", 65536},
                                    {"gfx942", 65536},
                                    {"gfx950", 163840}}) {
    INFO(name);
    CHECK(Target(name).max_shared_bytes_per_block() == bytes);
  }
  // One the table does not know: the least of sm_80 and newer, which any of them runs.
  CHECK(Target("sm_130").max_shared_bytes_per_block() == 101376);
}

TEST_CASE("targets are read where they come in: options, manifests, the default sets", "[target]") {
  const TempDir cache;
  Options options = isolated_options(cache.path(), "sm90");
  CHECK_THROWS_WITH(Runtime(options), Catch::Contains("did you mean sm_90 or sm_90a?"));
  options.target = "gfx90a";
  CHECK(Runtime(options).target() == "gfx90a");

  const std::string manifest =
      to_string(unary_spec(UnaryOp::cos, DType::f32, {256, 4})) + " @sm90\n";
  CHECK_THROWS_WITH(detail::parse_manifest(manifest, "m.txt"),
                    Catch::StartsWith("m.txt:1: target 'sm90' names no GPU architecture"));

  CHECK_THROWS_WITH(default_specs("sm90"), Catch::Contains("did you mean sm_90 or sm_90a?"));
  for (const KernelSpec& spec : default_specs("sm_90a")) CHECK(spec.target == "sm_90a");
  CHECK(kiln_warmup(0, "sm90", 1) == KILN_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(kiln_last_error(), Catch::Contains("did you mean sm_90 or sm_90a?"));
  // A target that none of the default kernels runs on is refused, not warmed with nothing.
  CHECK_THROWS_WITH(default_specs("gfx1100"), Catch::Contains("no default kernel runs on gfx1100"));
  CHECK(kiln_warmup(0, "gfx1100", 1) == KILN_ERROR_UNSUPPORTED);
  CHECK_THAT(kiln_last_error(), Catch::Contains("no default kernel runs on gfx1100"));
}

}  // namespace kiln::test
