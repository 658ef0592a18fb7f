// SPDX-License-Identifier: Apache-2.0
// Every attention and decode variant the hot path picks by default compiles with no GPU: the
// tensor-core kernels (mma, wgmma) through NVRTC, the portable kernels (forward and backward)
// through hipRTC for gfx90a and NVRTC.
#include <catch2/catch.hpp>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kernels/kernel.hpp"
#include "kiln/attention.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/decode.hpp"
#include "kiln/params/attention_backward.h"
#include "ops/validation_support.hpp"
#include "support.hpp"
#include "variant_twins.hpp"
#include "variants.hpp"

namespace {

using kiln::DType;

kiln::Runtime runtime_for(const std::filesystem::path& cache, const char* target) {
  return kiln::Runtime(kiln::test::isolated_options(cache, target));
}

// Warms `specs` on `rt` and checks that each compiled.
void check_compiled(kiln::Runtime& rt, const std::vector<kiln::KernelSpec>& specs) {
  const kiln::WarmupReport report = rt.warmup(specs, {.threads = 2});
  for (const kiln::WarmupItem& item : report.items) {
    INFO(item.spec << ": " << item.error);
    CHECK(item.status == kiln::WarmupStatus::compiled);
  }
}

// The wgmma dk/dv kernel at 128 query rows a step (choose()'s tiles up to head dim 64, unless a
// logit's derivative, ALiBi or a bias comes along) spills up to 236 bytes (without a mask, with
// varlen), and ran faster so than the config without spills (bench/RESULTS.md, run 57).
constexpr long long kWgmmaRows128Spill = 256;

// The integer constant `name` of `spec`.
int constant_of(const kiln::KernelSpec& spec, std::string_view name) {
  for (const kiln::Constant& c : spec.constants) {
    if (c.name == name) return static_cast<int>(std::get<std::int64_t>(c.value));
  }
  FAIL("no constant " << name << " in " << kiln::to_string(spec));
  return 0;
}

// The fewest registers a thread a build of a kernel that splits its registers between
// warpgroups (setmaxnreg) must have: the tma forward's, the wgmma dk/dv kernel's; 0 for others.
int setmaxnreg_least(const kiln::KernelSpec& spec) {
  if (spec.entry == "kiln::attention_forward_tma") {
    return kiln::attention_forward_tma_least_registers(constant_of(spec, "block_m"));
  }
  if (spec.entry == "kiln::attention_backward_dkdv_wgmma") {
    return kiln::attention_backward_wgmma_least_registers(constant_of(spec, "warps"));
  }
  return 0;
}

// check_compiled, and that none spills more than `most` bytes: 64 by default (some kernels'
// producer warps spill a little at 24 registers), kWgmmaRows128Spill for the wgmma dk/dv kernel
// at 128 rows a step; more is a regression worth a look. Kernels that split their registers
// between warpgroups got the registers their launch gives (require_launch_registers).
void check_compiled_without_spills(kiln::Runtime& rt, const std::vector<kiln::KernelSpec>& specs,
                                   long long most = 64) {
  check_compiled(rt, specs);
  for (const kiln::KernelSpec& spec : specs) {
    const kiln::KernelInfo info = rt.compile(spec);
    INFO(info.spec);
    CHECK(info.registers > 0);
    if (const int least = setmaxnreg_least(spec); least > 0) {
      CHECK_NOTHROW(kiln::detail::require_launch_registers(info, least, "another kernel"));
    }
    const bool rows128 = spec.entry.find("dkdv_wgmma") != std::string::npos &&
                         kiln::to_string(spec).find("block_m=128,") != std::string::npos;
    CHECK(info.spill_bytes <= (rows128 ? std::max(most, kWgmmaRows128Spill) : most));
  }
}

// The corners of the feature matrix: every feature at once at 192/128, the narrowest dim with
// varlen, a dim that is no multiple of 16 with a bias, and the widest with varlen.
std::vector<kiln::AttentionProblem> feature_problems() {
  return {{.dtype_q = DType::f16,
           .dtype_kv = DType::f16,
           .dtype_out = DType::f16,
           .head_dim = 192,
           .head_dim_v = 128,
           .band = true,
           .softcap = true,
           .alibi = true,
           .bias = true},
          {.head_dim = 8,
           .head_dim_v = 8,
           .band = true,
           .varlen = true,
           .softcap = true,
           .alibi = true},
          {.head_dim = 72, .head_dim_v = 72, .band = true, .bias = true},
          {.dtype_q = DType::f16,
           .dtype_kv = DType::f16,
           .dtype_out = DType::f16,
           .head_dim = 256,
           .head_dim_v = 256,
           .varlen = true,
           .softcap = true}};
}

// The feature problems' specs with the configs `config_target` gets.
std::vector<kiln::KernelSpec> feature_specs(const char* config_target) {
  std::vector<kiln::KernelSpec> specs;
  for (const kiln::AttentionProblem& problem : feature_problems()) {
    specs.push_back(kiln::attention_spec(problem, kiln::choose(problem, config_target)));
  }
  return specs;
}

}  // namespace

TEST_CASE("the default attention specs compile for sm_90a, without spilling much",
          "[attention][compile]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt = runtime_for(dir.path(), "sm_90a");
  const auto specs = kiln::attention_default_specs("sm_90a");
  // bf16 and f16 at head dims 64, 128 and 256, with and without a mask (12), and the longer key
  // blocks of long sequences at 64 with a mask and at 128 (6); e4m3 k and v under bf16 and f16 q
  // at those head dims, with and without a mask, and at 64 the longer key blocks with a mask
  // (14: the tma kernel's, which widens them in shared memory, but K under bf16, whose q it splits
  // into two e4m3 terms); e4m3 q, k and v with bf16 out at
  // 64, 128 and 256, with and without a mask (6: the tma kernel's fp8 products).
  REQUIRE(specs.size() == 38);
  // With NVRTC 13.0 at most 24 bytes spill (the masked d128 all-fp8 spec's producer warpgroup,
  // walking the tiles in its 40 registers; with 24 registers it spilled 52-92 bytes with a band).
  check_compiled_without_spills(rt, specs);
}

TEST_CASE("the default gfx90a attention specs compile with hipRTC, and with NVRTC for sm_90a",
          "[attention][compile]") {
  const auto specs = kiln::attention_default_specs("gfx90a");
  REQUIRE(specs.size() == 12);
  for (const kiln::KernelSpec& spec : specs)
    CHECK(spec.source == "attention/prefill/forward_portable.cuh");
  kiln::test::TempDir dir;
  // The same kernels on NVIDIA, where the [gpu] tests run them; no spills there.
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_90a");
  check_compiled(nvidia, specs);
  for (const kiln::KernelSpec& spec : specs) {
    const kiln::KernelInfo info = nvidia.compile(spec);
    INFO(info.spec);
    CHECK(info.spill_bytes == 0);
  }
  KILN_REQUIRE_HIPRTC();
  kiln::Runtime amd = runtime_for(dir.path(), "gfx90a");
  check_compiled(amd, specs);
}

TEST_CASE("attention with every feature compiles for sm_80 and sm_90a", "[attention][compile]") {
  kiln::test::TempDir dir;
  for (const char* target : {"sm_80", "sm_90a"}) {
    kiln::Runtime rt = runtime_for(dir.path(), target);
    check_compiled(rt, feature_specs(target));
  }
}

TEST_CASE("the wgmma attention kernel compiles every feature at padded head dims for sm_90a",
          "[attention][compile]") {
  // choose() gives wgmma only dims it pads little; any dim compiles (zero-padded to 64).
  std::vector<kiln::KernelSpec> specs;
  for (const kiln::AttentionProblem& problem : feature_problems()) {
    specs.push_back(kiln::attention_spec(
        problem,
        {.block_m = 64, .block_n = 64, .stages = 3, .kernel = kiln::AttentionKernel::wgmma}));
  }
  kiln::test::TempDir dir;
  kiln::Runtime rt = runtime_for(dir.path(), "sm_90a");
  check_compiled(rt, specs);
  for (const kiln::KernelSpec& spec : specs)
    CHECK(spec.source == "attention/prefill/forward_wgmma.cuh");
}

TEST_CASE("the portable attention kernel compiles every feature for gfx90a and sm_90a",
          "[attention][compile]") {
  kiln::test::TempDir dir;
  const std::vector<kiln::KernelSpec> specs = feature_specs("gfx90a");
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_90a");
  check_compiled(nvidia, specs);
  KILN_REQUIRE_HIPRTC();
  kiln::Runtime amd = runtime_for(dir.path(), "gfx90a");
  check_compiled(amd, specs);
}

TEST_CASE("the default backward specs compile for sm_90a and gfx90a, without spilling much",
          "[attention_backward][compile]") {
  // The row dots of bf16 and f16 at head dims 64, 128 and 256 (6), the sinks' sum (1), and the
  // dk/dv and dq kernels of each, with and without a mask (24); deterministic calls take the same
  // ones, except on sm_90a: its wgmma dk/dv kernel in turns (12).
  REQUIRE(kiln::attention_backward_default_specs("gfx90a").size() == 31);
  REQUIRE(kiln::attention_backward_default_specs("sm_90a").size() == 43);
  const auto specs = kiln::attention_backward_default_specs("sm_90a");
  kiln::test::TempDir dir;
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_90a");
  // With NVRTC 13.0 the mma kernels (head dim 256 here) spill nothing, and the wgmma ones at
  // most 24 bytes (the producer warpgroup's, at 24 registers; deterministic's turns take the
  // most; the consumers spilled 136 bytes while the compiler kept dS^T's and dQ's
  // shared-memory addresses across the loop), except at head dim 64: 128 rows a step
  // (kWgmmaRows128Spill).
  check_compiled_without_spills(nvidia, specs);
  KILN_REQUIRE_HIPRTC();
  kiln::Runtime amd = runtime_for(dir.path(), "gfx90a");
  check_compiled(amd, kiln::attention_backward_default_specs("gfx90a"));
}

// Adds to `specs` those of `more` it lacks.
void add_new(std::vector<kiln::KernelSpec>& specs, const std::vector<kiln::KernelSpec>& more) {
  for (const kiln::KernelSpec& spec : more) {
    if (std::find(specs.begin(), specs.end(), spec) == specs.end()) specs.push_back(spec);
  }
}

// The feature problems' backward specs with `config`, or choose()'s for `target` when none;
// with dsinks, and dbias where there is a bias.
std::vector<kiln::KernelSpec> backward_feature_specs(
    const char* target, std::optional<kiln::AttentionBackwardConfig> config = std::nullopt,
    bool deterministic = false) {
  std::vector<kiln::KernelSpec> specs;
  for (const kiln::AttentionProblem& problem : feature_problems()) {
    const kiln::AttentionBackwardProblem backward{
        .forward = problem, .deterministic = deterministic, .dsinks = true, .dbias = problem.bias};
    add_new(specs, kiln::attention_backward_specs(backward,
                                                  config.value_or(kiln::choose(backward, target))));
  }
  return specs;
}

TEST_CASE("the backward compiles every feature for sm_80 and gfx90a",
          "[attention_backward][compile]") {
  // The mma kernels with choose()'s tiles and with the [gpu] tests' (two warps a row group,
  // each on half the head dims); the portable ones, which NVIDIA runs too.
  std::vector<kiln::KernelSpec> nvidia_specs = backward_feature_specs("sm_80");
  add_new(nvidia_specs,
          backward_feature_specs("sm_80", kiln::AttentionBackwardConfig{
                                              .block_m = 16,
                                              .block_n = 32,
                                              .warps = 4,
                                              .kernel = kiln::AttentionBackwardKernel::mma}));
  const std::vector<kiln::KernelSpec> amd_specs = backward_feature_specs("gfx90a");
  add_new(nvidia_specs, amd_specs);
  kiln::test::TempDir dir;
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_80");
  check_compiled(nvidia, nvidia_specs);
  KILN_REQUIRE_HIPRTC();
  kiln::Runtime amd = runtime_for(dir.path(), "gfx90a");
  check_compiled(amd, amd_specs);
}

TEST_CASE("the wgmma backward compiles every feature for sm_90a, without spilling much",
          "[attention_backward][compile]") {
  std::vector<kiln::KernelSpec> specs;
  for (const bool deterministic : {false, true}) {
    std::vector<kiln::KernelSpec> candidates =
        backward_feature_specs("sm_90a", std::nullopt, deterministic);
    // choose()'s 128 rows a step at head dim 64 (kWgmmaRows128Spill), where it spills most:
    // varlen without a mask.
    const kiln::AttentionBackwardProblem tall{
        .forward = {.head_dim = 64, .head_dim_v = 64, .varlen = true},
        .deterministic = deterministic};
    add_new(candidates, kiln::attention_backward_specs(tall, kiln::choose(tall, "sm_90a")));
    for (const kiln::KernelSpec& spec : candidates) {
      if (spec.entry.find("dkdv_wgmma") != std::string::npos) specs.push_back(spec);
    }
  }
  REQUIRE(std::any_of(specs.begin(), specs.end(), [](const kiln::KernelSpec& spec) {
    return kiln::to_string(spec).find("block_m=128,") != std::string::npos;
  }));
  REQUIRE_FALSE(specs.empty());
  kiln::test::TempDir dir;
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_90a");
  // Above head dim 128 two warpgroups split the head dims and the step's queries: S^T and dP^T
  // of 32 queries a warpgroup, not 64, leave room for softcap's derivatives with a bias (which
  // spilled up to 292 bytes while each computed all 64).
  check_compiled_without_spills(nvidia, specs);
}

TEST_CASE("attention refuses targets it cannot run on", "[attention][compile]") {
  const kiln::AttentionProblem problem{.head_dim = 128, .head_dim_v = 128};
  CHECK_THROWS_WITH(kiln::choose(problem, "sm_75"), Catch::Contains("sm_80 or newer"));
  CHECK_THROWS_WITH(kiln::choose(problem, "gfx1100"),
                    Catch::Contains("gfx1100") && Catch::Contains("gfx9"));
  CHECK(kiln::attention_default_specs("gfx1100").empty());
  CHECK(kiln::attention_default_specs("sm_75").empty());
  using kiln::AttentionKernel;
  CHECK(kiln::choose(problem, "sm_90a").kernel == AttentionKernel::tma);
  CHECK(kiln::choose(problem, "sm_80").kernel == AttentionKernel::mma);
  CHECK(kiln::choose(problem, "sm_100a").kernel == AttentionKernel::mma);
  // From 64 up the tma kernel, padded to 64-column tiles (a third more work at 96, and still
  // faster than mma); below, mma, which pads to 16.
  for (int dim : {64, 80, 96}) {
    const kiln::AttentionProblem wide{.head_dim = dim, .head_dim_v = dim};
    CHECK(kiln::choose(wide, "sm_90a").kernel == AttentionKernel::tma);
  }
  const kiln::AttentionProblem narrow{.head_dim = 56, .head_dim_v = 56};
  CHECK(kiln::choose(narrow, "sm_90a").kernel == AttentionKernel::mma);
  CHECK(kiln::choose(problem, "gfx90a").kernel == AttentionKernel::portable);
  CHECK(kiln::choose(problem, "gfx942").kernel == AttentionKernel::portable);
}

TEST_CASE("attention with a given config: kernels are refused where they cannot run",
          "[attention]") {
  using kiln::AttentionKernel;
  using kiln::test::view;
  const kiln::TensorView q = view(0x1000000, DType::bf16, {1, 64, 2, 64});
  const kiln::TensorView out = view(0x2000000, DType::bf16, {1, 64, 2, 64});
  const auto call = [&](const kiln::AttentionConfig& config, const char* target) {
    return kiln::test::refusal([&] {
      kiln::attention(q, q, q, out, {}, config, nullptr, kiln::test::validating_runtime(target));
    });
  };
  const kiln::AttentionConfig mma;
  const kiln::AttentionConfig wgmma{.block_n = 128, .stages = 2, .kernel = AttentionKernel::wgmma};
  kiln::test::check_refusal(call(mma, "gfx90a"), kiln::ErrorCategory::unsupported,
                            {"mma", "gfx90a", "portable"});
  kiln::test::check_refusal(call(wgmma, "gfx90a"), kiln::ErrorCategory::unsupported,
                            {"wgmma", "gfx90a", "portable"});
  kiln::test::check_refusal(call(wgmma, "sm_80"), kiln::ErrorCategory::unsupported,
                            {"wgmma", "sm_90a", "sm_80", "AttentionKernel::mma"});
  kiln::test::check_refusal(call({.block_m = 0, .kernel = AttentionKernel::portable}, "sm_90a"),
                            kiln::ErrorCategory::invalid_argument, {"block_m 0"});
  // Before the kernel lookup too: the launch multiplies these into its threads and shared memory.
  kiln::test::check_refusal(call({.warps = 1 << 30}, "sm_90a"),
                            kiln::ErrorCategory::invalid_argument, {"warps 1073741824", "1 to 32"});
  kiln::test::check_refusal(call({.block_n = 1 << 30, .stages = 1 << 30}, "sm_90a"),
                            kiln::ErrorCategory::invalid_argument,
                            {"block_n 1073741824", "1 to 1024"});
  kiln::test::check_refusal(call({.kernel = static_cast<AttentionKernel>(7)}, "gfx90a"),
                            kiln::ErrorCategory::invalid_argument,
                            {"config.kernel is 7", "no AttentionKernel"});
  // Accepted configs reach the kernel lookup, which finds nothing to load here.
  const kiln::AttentionConfig portable{
      .block_m = 32, .block_n = 32, .warps = 8, .kernel = AttentionKernel::portable};
  CHECK_THAT(call(mma, "sm_90a").message, Catch::Contains("attention/prefill/forward.cuh"));
  CHECK_THAT(call(wgmma, "sm_90a").message, Catch::Contains("attention/prefill/forward_wgmma.cuh"));
  const auto reaches_lookup = [&](const char* target) {
    const kiln::test::Refusal r = call(portable, target);
    CHECK(r.category == kiln::ErrorCategory::not_found);
    CHECK_THAT(r.message, Catch::Contains("attention/prefill/forward_portable.cuh"));
  };
  reaches_lookup("sm_90a");
  KILN_REQUIRE_HIPRTC();  // the lookup asks gfx90a's compiler for the key
  reaches_lookup("gfx90a");
}

TEST_CASE("the default decode specs compile for sm_90a without spilling, and none for gfx90a",
          "[decode][compile]") {
  kiln::test::TempDir dir;
  kiln::Runtime rt = runtime_for(dir.path(), "sm_90a");
  const auto specs = kiln::decode_default_specs("sm_90a");
  // bf16 and f16 caches and e4m3 ones under bf16 and f16 q (with and without descales per
  // token), head dims 64 and 128: contiguous and paged attention (24), and merge_states of bf16
  // and f16 (4).
  REQUIRE(specs.size() == 28);
  check_compiled(rt, specs);
  for (const kiln::KernelSpec& spec : specs) {
    const kiln::KernelInfo info = rt.compile(spec);
    INFO(info.spec);
    CHECK(info.spill_bytes == 0);
  }
  CHECK(kiln::decode_default_specs("gfx90a").empty());
  CHECK(kiln::decode_default_specs("sm_75").empty());
  CHECK(kiln::decode_default_specs("sm_80").size() == 12);  // no fp8 conversions there

  // Where a CTA gets 99 KiB, head dim 256 streams with two warps (tests/ops/launch_plan_test.cpp).
  const kiln::DecodeProblem d256{
      .head_dim = 256, .head_dim_v = 256, .rows_per_kv_head = 8, .paged = true};
  const kiln::DecodeConfig narrow = kiln::choose(d256, "sm_86", 84);
  REQUIRE(narrow.warps == 2);
  kiln::Runtime ampere = runtime_for(dir.path(), "sm_86");
  check_compiled(ampere, kiln::decode_specs(d256, narrow));
}

TEST_CASE("a variant's code is in its spec and key, and its compile errors point at its lines",
          "[attention][compile][variant]") {
  const kiln::test::TempDir cache;
  kiln::Runtime rt = runtime_for(cache.path(), "sm_90a");
  kiln::AttentionProblem problem{.head_dim = 128, .head_dim_v = 128, .band = true};
  const kiln::KernelSpec plain = kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
  problem.variant = &kiln::examples::alibi_variant();
  const kiln::KernelSpec alibi = kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
  CHECK_THAT(kiln::to_string(alibi), Catch::Contains("(kiln::AttentionTmaParams) {variant alibi "));
  CHECK(kiln::hash_value(alibi) != kiln::hash_value(plain));
  // The same name with other code is another kernel.
  const kiln::Variant other{.name = "alibi", .code = kiln::examples::alibi_variant().code + "\n"};
  problem.variant = &other;
  const kiln::KernelSpec changed = kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
  CHECK(kiln::to_string(changed) != kiln::to_string(alibi));
  CHECK(kiln::hash_value(changed) != kiln::hash_value(alibi));
  CHECK(rt.key(changed) != rt.key(alibi));
  CHECK_THROWS_WITH(
      kiln::parse_spec(kiln::to_string(alibi)),
      Catch::Contains("names the user variant alibi, whose code a spec line does not carry"));

  // The example variants compile into every attention kernel, prefill and decode.
  std::vector<kiln::KernelSpec> specs;
  for (const kiln::Variant* variant :
       {&kiln::examples::alibi_variant(), &kiln::examples::document_variant(),
        &kiln::examples::relative_bias_variant(), &kiln::examples::t5_bias_variant(),
        &kiln::examples::key_padding_variant(), &kiln::examples::softmax_one_variant()}) {
    problem.variant = variant;
    for (const kiln::AttentionKernel kernel :
         {kiln::AttentionKernel::tma, kiln::AttentionKernel::wgmma, kiln::AttentionKernel::mma,
          kiln::AttentionKernel::portable}) {
      kiln::AttentionConfig config{.block_m = 128, .block_n = 64, .stages = 2, .kernel = kernel};
      if (kernel == kiln::AttentionKernel::mma) config = kiln::choose(problem, "sm_80");
      if (kernel == kiln::AttentionKernel::portable) config = kiln::choose(problem, "gfx90a");
      specs.push_back(kiln::attention_spec(problem, config));
    }
    const kiln::DecodeProblem decode{
        .head_dim = 128, .head_dim_v = 128, .rows_per_kv_head = 4, .variant = variant};
    for (kiln::KernelSpec& spec : kiln::decode_specs(decode, kiln::choose(decode, "sm_90a", 132))) {
      specs.push_back(std::move(spec));
    }
  }
  for (kiln::KernelSpec& spec : specs) spec.target = "sm_90a";
  check_compiled(rt, specs);

  // The compile error of `variant`'s kernel, which must fail.
  const auto compile_error = [&](const kiln::Variant& variant) {
    problem.variant = &variant;
    kiln::KernelSpec spec = kiln::attention_spec(problem, kiln::choose(problem, "sm_90a"));
    spec.target = "sm_90a";
    const kiln::WarmupReport report = rt.warmup(std::span(&spec, 1), {.threads = 1});
    REQUIRE(report.items.size() == 1);
    CHECK(report.items[0].status == kiln::WarmupStatus::failed);
    return report.items[0].error;
  };
  // An error on the variant's third line names the variant and that line.
  const kiln::Variant broken{.name = "broken", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x + ;
  }
};)"};
  CHECK_THAT(compile_error(broken), Catch::Contains("variant broken(3)"));
  // A kiln_variant without any hook (here a misspelt one) says which hooks there are.
  const kiln::Variant hookless{.name = "hookless", .code = R"(struct kiln_variant {
  static __device__ float logits(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x;
  }
};)"};
  CHECK_THAT(compile_error(hookless), Catch::Contains("kiln_variant defines none of its hooks"));
  // Per-row state without a row() that makes it would be left zero: both are refused.
  const kiln::Variant stateless{.name = "stateless", .code = R"(struct kiln_variant {
  float slope;
  __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) const {
    return x * slope;
  }
};)"};
  CHECK_THAT(compile_error(stateless),
             Catch::Contains("kiln_variant has data members but no row() to fill them"));
  const kiln::Variant misshapen{.name = "misshapen", .code = R"(struct kiln_variant {
  float slope;
  static __device__ kiln_variant row(const kiln::VariantCoords& at) { return {1.f * at.head}; }
  __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) const {
    return x * slope;
  }
};)"};
  CHECK_THAT(compile_error(misshapen), Catch::Contains("kiln_variant::row must be static"));
  // A hook that cannot be called as one (here not const) is refused, not skipped.
  const kiln::Variant mutable_hook{.name = "mutable_hook", .code = R"(struct kiln_variant {
  float slope;
  static __device__ kiln_variant row(const kiln::VariantParams&, const kiln::VariantCoords&) {
    return {1.f};
  }
  __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x * slope;
  }
  static __device__ bool mask(const kiln::VariantParams&, const kiln::VariantCoords&) {
    return true;
  }
};)"};
  CHECK_THAT(compile_error(mutable_hook),
             Catch::Contains("kiln_variant::logit must be a static or const __device__ member"));
}

TEST_CASE(
    "the backward compiles user variants for sm_80 and gfx90a, and refuses what it cannot "
    "differentiate",
    "[attention_backward][compile][variant]") {
  // Additive logit hooks with a row's state, a mask hook, a sink hook and a nonlinear logit hook
  // with its logit_grad, into the mma kernels and the portable ones, masked or not, with every
  // score feature.
  std::vector<kiln::KernelSpec> nvidia_specs, amd_specs;
  for (const kiln::Variant* variant :
       {&kiln::examples::alibi_variant(), &kiln::examples::document_variant(),
        &kiln::examples::key_padding_variant(), &kiln::examples::softmax_one_variant(),
        &kiln::test::gated_cap_variant()}) {
    for (kiln::AttentionProblem problem : {feature_problems()[0], feature_problems()[2]}) {
      problem.variant = variant;
      // dsinks only where the variant has no sink hook, which it would refuse.
      const kiln::AttentionBackwardProblem backward{
          .forward = problem, .dsinks = variant != &kiln::examples::softmax_one_variant()};
      add_new(nvidia_specs,
              kiln::attention_backward_specs(backward, kiln::choose(backward, "sm_80")));
      add_new(amd_specs,
              kiln::attention_backward_specs(backward, kiln::choose(backward, "gfx90a")));
    }
  }
  add_new(nvidia_specs, amd_specs);
  kiln::test::TempDir dir;
  kiln::Runtime nvidia = runtime_for(dir.path(), "sm_80");
  check_compiled(nvidia, nvidia_specs);
  // The wgmma kernels (choose()'s on sm_90a at head dim 128), under a nonlinear logit hook with
  // a row's state.
  kiln::AttentionProblem d128{.head_dim = 128, .head_dim_v = 128, .band = true, .softcap = true};
  d128.variant = &kiln::test::gated_cap_variant();
  const kiln::AttentionBackwardProblem hopper{.forward = d128};
  const kiln::AttentionBackwardConfig wgmma = kiln::choose(hopper, "sm_90a");
  CHECK(wgmma.kernel == kiln::AttentionBackwardKernel::wgmma);
  kiln::Runtime sm90 = runtime_for(dir.path(), "sm_90a");
  check_compiled(sm90, kiln::attention_backward_specs(hopper, wgmma));

  // Another variant is another kernel; the row dots take one only with dsinks.
  kiln::AttentionBackwardProblem problem{.forward = feature_problems()[2]};
  const auto specs_of = [&](const kiln::Variant* variant) {
    problem.forward.variant = variant;
    return kiln::attention_backward_specs(problem, kiln::choose(problem, "sm_80"));
  };
  const std::vector<kiln::KernelSpec> plain = specs_of(nullptr);
  const std::vector<kiln::KernelSpec> alibi = specs_of(&kiln::examples::alibi_variant());
  const std::vector<kiln::KernelSpec> document = specs_of(&kiln::examples::document_variant());
  REQUIRE(alibi.size() == 3);
  CHECK(alibi[0] == plain[0]);
  for (std::size_t i = 1; i < 3; ++i) {  // dk/dv and dq
    CHECK_THAT(kiln::to_string(alibi[i]), Catch::Contains("{variant alibi "));
    CHECK(nvidia.key(alibi[i]) != nvidia.key(plain[i]));
    CHECK(nvidia.key(alibi[i]) != nvidia.key(document[i]));
  }
  problem.dsinks = true;
  CHECK_THAT(kiln::to_string(specs_of(&kiln::examples::alibi_variant())[0]),
             Catch::Contains("{variant alibi "));

  // The compile error of `variant`'s backward kernels (dsinks or not), which must fail.
  const auto compile_error = [&](const kiln::Variant& variant, bool dsinks) {
    problem.dsinks = dsinks;
    std::vector<kiln::KernelSpec> specs = specs_of(&variant);
    for (kiln::KernelSpec& spec : specs) spec.target = "sm_80";
    const kiln::WarmupReport report = nvidia.warmup(specs, {.threads = 1});
    std::string errors;
    for (const kiln::WarmupItem& item : report.items) {
      if (item.status == kiln::WarmupStatus::failed) errors += item.error;
    }
    CHECK_FALSE(errors.empty());
    return errors;
  };
  // A nonlinear logit hook without its derivative; the forward takes it.
  const kiln::Variant squared{.name = "squared", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x * x;
  }
};)"};
  CHECK_THAT(compile_error(squared, false),
             Catch::Contains("the backward needs the derivative of kiln_variant::logit") &&
                 Catch::Contains("logit_grad") && Catch::Contains("logit_is_additive"));
  kiln::AttentionProblem forward = feature_problems()[2];
  forward.variant = &squared;
  kiln::KernelSpec forward_spec = kiln::attention_spec(forward, kiln::choose(forward, "sm_80"));
  forward_spec.target = "sm_80";
  check_compiled(nvidia, {forward_spec});
  // A logit_grad that cannot be called as one, or one beside logit_is_additive.
  const kiln::Variant mutable_grad{.name = "mutable_grad", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x * x;
  }
  __device__ float logit_grad(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return 2.f * x;
  }
};)"};
  CHECK_THAT(compile_error(mutable_grad, false),
             Catch::Contains("kiln_variant::logit_grad must be a static or const __device__"));
  const kiln::Variant both{.name = "both", .code = R"(struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x + 1.f;
  }
  static __device__ float logit_grad(const kiln::VariantParams&, const kiln::VariantCoords&,
                                     float) {
    return 1.f;
  }
};)"};
  CHECK_THAT(compile_error(both, false),
             Catch::Contains("declares logit_is_additive and has a logit_grad too"));
  // dbias under a nonlinear logit hook (its factor is not in dbias yet); gated_cap's kernels
  // without dbias compile (above).
  problem.dbias = true;
  CHECK_THAT(compile_error(kiln::test::gated_cap_variant(), false),
             Catch::Contains("grads.dbias under a kiln_variant::logit that is not additive"));
  problem.dbias = false;
  // dsinks through a sink hook; without dsinks its kernels compile (above).
  CHECK_THAT(compile_error(kiln::examples::softmax_one_variant(), true),
             Catch::Contains("grads.dsinks through kiln_variant::sink is not supported yet"));

  KILN_REQUIRE_HIPRTC();
  kiln::Runtime amd = runtime_for(dir.path(), "gfx90a");
  check_compiled(amd, amd_specs);
}
