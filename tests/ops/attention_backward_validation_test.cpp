// SPDX-License-Identifier: Apache-2.0
// kiln::attention_backward() input validation and its choose / specs path, with no GPU: every bad
// input is refused with a kiln::Error that names the tensor and the fix, before anything needs a
// device.
#include <catch2/catch.hpp>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kiln/attention_backward.hpp"
#include "kiln/error.hpp"
#include "kiln/variant.hpp"
#include "ops/validation_support.hpp"

namespace {

using kiln::DType;
using kiln::ErrorCategory;
using kiln::TensorView;
using kiln::test::check_refusal;
using kiln::test::refusal;
using kiln::test::reshaped;
using kiln::test::validating_runtime;
using kiln::test::view;

struct Call {
  TensorView q, k, v, out, dout, dq, dk, dv;
  kiln::AttentionOptions options;
  kiln::AttentionGradOptions grads;
};

// A valid padded-batch GQA call: batch 2, seqlen_q 128, seqlen_k 256, 8 query heads on 2 kv
// heads, head dim 64, with the forward's lse.
Call padded_call(DType dtype = DType::bf16) {
  Call c{view(0x1000000, dtype, {2, 128, 8, 64}),
         view(0x2000000, dtype, {2, 256, 2, 64}),
         view(0x3000000, dtype, {2, 256, 2, 64}),
         view(0x4000000, dtype, {2, 128, 8, 64}),
         view(0x5000000, dtype, {2, 128, 8, 64}),
         view(0x6000000, dtype, {2, 128, 8, 64}),
         view(0x7000000, dtype, {2, 256, 2, 64}),
         view(0x8000000, dtype, {2, 256, 2, 64}),
         {},
         {}};
  c.options.lse = view(0x9000000, DType::f32, {2, 8, 128});
  return c;
}

// A valid varlen call: 3 sequences, 100 query and 300 key tokens in all.
Call varlen_call() {
  Call c{view(0x1000000, DType::bf16, {100, 8, 64}),
         view(0x2000000, DType::bf16, {300, 2, 64}),
         view(0x3000000, DType::bf16, {300, 2, 64}),
         view(0x4000000, DType::bf16, {100, 8, 64}),
         view(0x5000000, DType::bf16, {100, 8, 64}),
         view(0x6000000, DType::bf16, {100, 8, 64}),
         view(0x7000000, DType::bf16, {300, 2, 64}),
         view(0x8000000, DType::bf16, {300, 2, 64}),
         {},
         {}};
  c.options.cu_seqlens_q = view(0x9000000, DType::i32, {4});
  c.options.cu_seqlens_k = view(0x9100000, DType::i32, {4});
  c.options.max_seqlen_q = 50;
  c.options.max_seqlen_k = 150;
  c.options.lse = view(0x9200000, DType::f32, {8, 100});
  return c;
}

void call(const Call& c) {
  kiln::attention_backward(c.q, c.k, c.v, c.out, c.dout, c.dq, c.dk, c.dv, c.options, c.grads,
                           nullptr, validating_runtime());
}

void check_refused(const Call& c, ErrorCategory category,
                   std::initializer_list<const char*> words) {
  check_refusal(refusal([&] { call(c); }), category, words);
}

void check_invalid(const Call& c, std::initializer_list<const char*> words) {
  check_refused(c, ErrorCategory::invalid_argument, words);
}

// Whether `c` got through validation: it returned (nothing to do) or reached the kernel lookup,
// which fails here (no compiling, no driver or no device) naming the backward.
void check_accepted(const Call& c) {
  try {
    call(c);
  } catch (const kiln::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("backward"));
  }
}

}  // namespace

TEST_CASE("attention backward passes valid calls", "[attention_backward]") {
  check_accepted(padded_call());
  check_accepted(padded_call(DType::f16));
  check_accepted(varlen_call());

  Call options = padded_call();
  options.options.score = {
      .softmax_scale = 0.5f, .causal = true, .window_left = 32, .top_left = true, .softcap = 30};
  options.options.score.alibi_slopes = view(0xa000000, DType::f32, {2, 8});
  options.options.score.sinks = view(0xa100000, DType::f32, {8});
  options.options.seqused_k = view(0xa200000, DType::i32, {2});
  options.options.bias = view(0xa300000, DType::bf16, {2, 8, 128, 256});
  options.grads = {.deterministic = true,
                   .dsinks = view(0xa400000, DType::f32, {8}),
                   .dbias = view(0xa500000, DType::bf16, {2, 8, 128, 256})};
  check_accepted(options);

  // dbias takes the bias's shape, also where it broadcasts by size 1 (dbias sums there) or by
  // stride 0 (a dense dbias: every element its own gradient); its own strides are free.
  Call broadcast = padded_call();
  broadcast.options.bias = view(0xa300000, DType::bf16, {1, 8, 128, 256});
  broadcast.grads.dbias = view(0xa500000, DType::bf16, {1, 8, 128, 256});
  check_accepted(broadcast);
  broadcast.options.bias->strides[0] = 0;
  broadcast.options.bias->shape[0] = 2;
  broadcast.grads.dbias = view(0xa500000, DType::bf16, {2, 8, 128, 256});
  check_accepted(broadcast);
  broadcast.grads.dbias = view(0xa500000, DType::bf16, {2, 8, 256, 128});
  std::swap(broadcast.grads.dbias->shape[2], broadcast.grads.dbias->shape[3]);
  std::swap(broadcast.grads.dbias->strides[2], broadcast.grads.dbias->strides[3]);
  check_accepted(broadcast);

  // Empty problems pass validation too (the kernels still zero dk, dv and dsinks where they
  // have elements).
  Call no_batch = padded_call();
  for (TensorView* t : {&no_batch.q, &no_batch.k, &no_batch.v, &no_batch.out, &no_batch.dout,
                        &no_batch.dq, &no_batch.dk, &no_batch.dv}) {
    t->shape[0] = 0;
  }
  no_batch.options.lse = view(0x9000000, DType::f32, {0, 8, 128});
  check_accepted(no_batch);
  // A dbias of size 1 over the batch still has elements: their sums over no batch, 0.
  no_batch.options.bias = view(0xa300000, DType::bf16, {1, 8, 128, 256});
  no_batch.grads.dbias = view(0xa500000, DType::bf16, {1, 8, 128, 256});
  check_accepted(no_batch);
  Call empty = padded_call();
  for (TensorView* t :
       {&empty.q, &empty.k, &empty.v, &empty.out, &empty.dout, &empty.dq, &empty.dk, &empty.dv}) {
    t->shape[1] = 0;
  }
  empty.options.lse = view(0x9000000, DType::f32, {2, 8, 0});
  check_accepted(empty);
}

TEST_CASE("attention backward refuses fp8 k and v, which the forward alone takes",
          "[attention_backward]") {
  Call c = padded_call();
  c.k.dtype = c.v.dtype = c.dk.dtype = c.dv.dtype = DType::e4m3;
  check_invalid(
      c, {"k has dtype e4m3 but q has dtype bf16: attention's backward takes", "so k needs bf16"});
}

TEST_CASE("attention backward refuses a call without the forward's lse", "[attention_backward]") {
  Call c = padded_call();
  c.options.lse.reset();
  check_invalid(c, {"the backward needs the forward's LSE in options.lse", "pass the forward"});
  c = varlen_call();
  c.options.lse.reset();
  check_invalid(c, {"options.lse"});
}

TEST_CASE("attention backward refuses dout, dq, dk and dv of the wrong shape or dtype",
          "[attention_backward]") {
  Call c = padded_call();
  c.dout = reshaped(c.dout, {2, 127, 8, 64});
  check_invalid(c, {"dout.size(1) is 127 but out.size(1) is 128", "dout takes out's shape"});

  c = padded_call();
  c.dout.dtype = DType::f16;
  check_invalid(c, {"dout has dtype f16 but out has dtype bf16", "dout takes out's dtype"});

  c = padded_call();
  c.dq = reshaped(c.dq, {2, 128, 8, 72});
  check_invalid(c, {"dq.size(3) is 72 but q.size(3) is 64", "dq takes q's shape"});

  c = padded_call();
  c.dq.dtype = DType::f32;
  check_invalid(c, {"dq has dtype f32 but q has dtype bf16"});

  // dk and dv take k's and v's shapes: under GQA the kv heads, not the query heads.
  c = padded_call();
  c.dk = reshaped(c.dk, {2, 256, 8, 64});
  check_invalid(c, {"dk.size(2) is 8 but k.size(2) is 2"});

  c = padded_call();
  c.dk.dtype = DType::f16;
  check_invalid(c, {"dk has dtype f16 but k has dtype bf16"});

  c = padded_call();
  c.dv = reshaped(c.dv, {2, 255, 2, 64});
  check_invalid(c, {"dv.size(1) is 255 but v.size(1) is 256"});

  c = padded_call();
  c.dv.dtype = DType::f16;
  check_invalid(c, {"dv has dtype f16 but v has dtype bf16"});

  c = varlen_call();
  c.dk = reshaped(c.dk, {299, 2, 64});
  check_invalid(c, {"dk.size(0) is 299 but k.size(0) is 300"});
}

TEST_CASE("attention backward refuses a varlen call without the longest key sequence",
          "[attention_backward]") {
  Call c = varlen_call();
  c.options.max_seqlen_k = 0;
  check_invalid(c, {"max_seqlen_k is 0", "longest key sequence", "300"});
}

TEST_CASE("attention backward refuses dsinks without sinks, or of the wrong shape or dtype",
          "[attention_backward]") {
  Call c = padded_call();
  c.grads.dsinks = view(0xa400000, DType::f32, {8});
  check_invalid(c, {"grads.dsinks is set but options.score.sinks is not", "leave dsinks unset"});

  c.options.score.sinks = view(0xa100000, DType::f32, {8});
  c.grads.dsinks = view(0xa400000, DType::f32, {4});
  check_invalid(c, {"dsinks.size(-1) is 4 but heads is 8"});

  c.grads.dsinks = view(0xa400000, DType::bf16, {8});
  check_invalid(c, {"dsinks has dtype bf16: it must be f32"});
}

TEST_CASE("attention backward refuses dbias without a bias, or not of its shape and dtype",
          "[attention_backward]") {
  Call c = padded_call();
  c.grads.dbias = view(0xa500000, DType::bf16, {2, 8, 128, 256});
  check_invalid(c, {"grads.dbias is set but options.bias is not", "leave dbias unset"});

  // The bias broadcasts over the batch by size 1: dbias sums there, so it has size 1 too.
  c.options.bias = view(0xa300000, DType::bf16, {1, 8, 128, 256});
  check_invalid(c, {"dbias.size(0) is 2 but bias.size(0) is 1", "dbias takes bias's shape"});

  c.options.bias = view(0xa300000, DType::bf16, {2, 8, 128, 256});
  c.grads.dbias = view(0xa500000, DType::bf16, {2, 8, 128});
  check_invalid(c, {"dbias has rank 3 but bias has rank 4"});

  c.grads.dbias = view(0xa500000, DType::f32, {2, 8, 128, 256});
  check_invalid(c, {"dbias has dtype f32 but bias has dtype bf16", "dbias takes bias's dtype"});

  // Each element of dbias is written once: a stride 0 would put several at one address.
  c.grads.dbias = view(0xa500000, DType::bf16, {2, 8, 128, 256});
  c.grads.dbias->strides[1] = 0;
  check_invalid(c, {"dbias.stride(1) is 0 but dbias.size(1) is 8"});
}

// A user variant reaches its kernels, whose compile refuses what the backward cannot
// differentiate (tests/ops/attention_compile_test.cpp); its tensors are validated as the
// forward's.
TEST_CASE("attention backward takes user variants, validated as the forward's",
          "[attention_backward][variant]") {
  Call c = padded_call();
  const kiln::Variant variant{.name = "identity", .code = R"(struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x;
  }
};
)"};
  c.options.score.variant = &variant;
  c.options.score.variant_tensors = {view(0xa600000, DType::f32, {8})};
  c.options.score.sinks = view(0xa100000, DType::f32, {8});
  c.grads.dsinks = view(0xa400000, DType::f32, {8});
  check_accepted(c);
  c.options.score.variant_tensors.assign(5, view(0xa600000, DType::f32, {8}));
  check_invalid(c, {"variant_tensors holds 5 tensors: a variant takes at most 4"});
  const kiln::Variant empty{.name = "empty", .code = ""};
  c.options.score.variant = &empty;
  c.options.score.variant_tensors.clear();
  check_invalid(c, {"variant 'empty' has no code"});
}

TEST_CASE("attention backward's choose, specs and default specs, with no device",
          "[attention_backward]") {
  const kiln::AttentionBackwardProblem problem{
      .forward = {.head_dim = 128, .head_dim_v = 128, .band = true}};
  for (const char* target : {"sm_80", "sm_86", "sm_90a", "gfx90a"}) {
    INFO(target);
    const kiln::AttentionBackwardConfig config = kiln::choose(problem, target);
    // Tensor cores on NVIDIA (wgmma on sm_90a, deterministic or not), the portable kernels on
    // AMD.
    const std::string name = target;
    CHECK(config.kernel == (name.starts_with("gfx") ? kiln::AttentionBackwardKernel::portable
                            : name == "sm_90a"      ? kiln::AttentionBackwardKernel::wgmma
                                                    : kiln::AttentionBackwardKernel::mma));
    kiln::AttentionBackwardProblem deterministic = problem;
    deterministic.deterministic = true;
    CHECK(kiln::choose(deterministic, target).kernel == config.kernel);
    // At head dim 64 too (choose()'s NOTE).
    kiln::AttentionBackwardProblem narrow = deterministic;
    narrow.forward.head_dim = narrow.forward.head_dim_v = 64;
    CHECK(kiln::choose(narrow, target).kernel == config.kernel);
    if (config.kernel == kiln::AttentionBackwardKernel::wgmma) {
      // Its dk/dv kernel orders dq's additions: a spec of its own.
      const std::vector<kiln::KernelSpec> specs = kiln::attention_backward_specs(problem, config);
      const std::vector<kiln::KernelSpec> ordered =
          kiln::attention_backward_specs(deterministic, config);
      CHECK_THAT(kiln::to_string(ordered[1]), Catch::Contains("deterministic=true"));
      CHECK_THAT(kiln::to_string(specs[1]), Catch::Contains("deterministic=false"));
    }
    // Above 128, sm_90a's two warpgroups split the head dims over 64 keys, deterministic or
    // not (choose()'s NOTE).
    kiln::AttentionBackwardProblem wide = problem;
    wide.forward.head_dim = 256;
    wide.forward.head_dim_v = 192;
    const kiln::AttentionBackwardConfig wide_config = kiln::choose(wide, target);
    if (name == "sm_90a") {
      CHECK(wide_config.kernel == kiln::AttentionBackwardKernel::wgmma);
      CHECK((wide_config.block_m == 64 && wide_config.block_n == 64 && wide_config.warps == 8));
      CHECK(kiln::attention_backward_specs(wide, wide_config).size() == 3);
    } else {
      CHECK(wide_config.kernel != kiln::AttentionBackwardKernel::wgmma);
    }
    wide.deterministic = true;
    CHECK(kiln::choose(wide, target).kernel == wide_config.kernel);
    // The wgmma rows go by q's head dim, which dQ's columns have (run 31d compiled a split of
    // head dim 64's into 32 and 32 for head_dim_v 128).
    kiln::AttentionBackwardProblem narrow_qk = problem;
    narrow_qk.forward.head_dim = 64;
    if (name == "sm_90a") CHECK(kiln::choose(narrow_qk, target).block_n == 64);
    // Up to 64 both, 128 rows a step over 128 keys; with softcap (whose derivatives would spill
    // there) 64 over 64.
    narrow_qk.forward.head_dim_v = 64;
    const kiln::AttentionBackwardConfig tall = kiln::choose(narrow_qk, target);
    narrow_qk.forward.softcap = true;
    const kiln::AttentionBackwardConfig with_softcap = kiln::choose(narrow_qk, target);
    if (name == "sm_90a") {
      CHECK((tall.block_m == 128 && tall.block_n == 128 && tall.warps == 8));
      CHECK((with_softcap.block_m == 64 && with_softcap.block_n == 64 && with_softcap.warps == 4));
    }
    // The row-dot pre-pass, the dk/dv kernel and the dq kernel; the sinks' reduction between
    // them when asked.
    CHECK(kiln::attention_backward_specs(problem, config).size() == 3);
    kiln::AttentionBackwardProblem with_sinks = problem;
    with_sinks.dsinks = true;
    CHECK(kiln::attention_backward_specs(with_sinks, config).size() == 4);
    // With dbias, its sum after them; the dk/dv kernel is another spec (has_dbias).
    kiln::AttentionBackwardProblem with_dbias = problem;
    with_dbias.forward.bias = true;
    with_dbias.dbias = true;
    const kiln::AttentionBackwardConfig dbias_config = kiln::choose(with_dbias, target);
    CHECK(dbias_config.kernel == config.kernel);
    const std::vector<kiln::KernelSpec> specs =
        kiln::attention_backward_specs(with_dbias, dbias_config);
    REQUIRE(specs.size() == 4);
    CHECK(specs[3].entry == "kiln::attention_backward_dbias");
    with_dbias.dbias = false;
    CHECK(specs[1] != kiln::attention_backward_specs(with_dbias, dbias_config)[1]);
    CHECK_FALSE(kiln::attention_backward_default_specs(target).empty());
  }
  const kiln::test::Refusal old = refusal([&] { kiln::choose(problem, "sm_75"); });
  check_refusal(old, ErrorCategory::unsupported, {"sm_80 or newer"});
  CHECK(kiln::attention_backward_default_specs("sm_75").empty());
}

// A caller's config: the mma kernels use NVIDIA instructions, and a kernel must be one there is.
TEST_CASE("attention backward refuses the mma kernels on AMD, and kernels that do not exist",
          "[attention_backward]") {
  const Call c = padded_call();
  const auto with = [&](kiln::AttentionBackwardConfig config, const char* target) {
    return refusal([&] {
      kiln::attention_backward(c.q, c.k, c.v, c.out, c.dout, c.dq, c.dk, c.dv, c.options, c.grads,
                               config, nullptr, validating_runtime(target));
    });
  };
  const kiln::AttentionBackwardConfig mma{.kernel = kiln::AttentionBackwardKernel::mma};
  check_refusal(with(mma, "gfx90a"), ErrorCategory::unsupported,
                {"the mma backward kernel uses NVIDIA instructions and cannot run on gfx90a",
                 "AttentionBackwardKernel::portable"});
  // Tiles the mma kernel cannot hold are refused before any compile, naming the rules.
  for (const kiln::AttentionBackwardConfig bad :
       {kiln::AttentionBackwardConfig{
            .block_m = 24, .block_n = 48, .warps = 3, .kernel = mma.kernel},
        kiln::AttentionBackwardConfig{
            .block_m = 64, .block_n = 40, .warps = 8, .kernel = mma.kernel},
        kiln::AttentionBackwardConfig{
            .block_m = 64, .block_n = 64, .warps = 6, .kernel = mma.kernel},
        kiln::AttentionBackwardConfig{
            .block_m = 128, .block_n = 32, .warps = 2, .kernel = mma.kernel}}) {
    INFO(bad.block_m << " " << bad.block_n << " " << bad.warps);
    check_refusal(with(bad, "sm_90a"), ErrorCategory::invalid_argument,
                  {"breaks the kernel's tile rules", "multiple of 16 up to 256", "warps * 32"});
  }
  // The wgmma kernels: sm_90a only, their tile rules, head dims up to 128 a warpgroup.
  const kiln::AttentionBackwardConfig wgmma{
      .block_m = 64, .block_n = 64, .warps = 4, .kernel = kiln::AttentionBackwardKernel::wgmma};
  check_refusal(with(wgmma, "sm_80"), ErrorCategory::unsupported,
                {"the wgmma backward kernel runs on sm_90a (H100, H200) only", "sm_80",
                 "AttentionBackwardKernel::mma"});
  kiln::AttentionBackwardConfig bad_wgmma = wgmma;
  bad_wgmma.warps = 12;
  check_refusal(with(bad_wgmma, "sm_90a"), ErrorCategory::invalid_argument,
                {"wgmma backward config (block_m 64, block_n 64, warps 12)", "warps = block_n / 16",
                 "warps 8 over block_n 64"});
  bad_wgmma.block_n = 128;
  bad_wgmma.warps = 16;
  check_refusal(with(bad_wgmma, "sm_90a"), ErrorCategory::invalid_argument,
                {"(block_m 64, block_n 128, warps 16)", "warps = block_n / 16"});
  bad_wgmma = wgmma;
  bad_wgmma.block_m = 128;
  bad_wgmma.block_n = 64;
  for (int warps : {4, 8}) {
    bad_wgmma.warps = warps;
    check_refusal(with(bad_wgmma, "sm_90a"), ErrorCategory::invalid_argument, {"at most block_n"});
  }
  // A warpgroup holds dK and dV for 128 head dims: wider ones need the split config.
  kiln::AttentionBackwardProblem wide{.forward = {.head_dim = 128, .head_dim_v = 136}};
  for (const kiln::AttentionBackwardConfig& narrow :
       {wgmma, kiln::AttentionBackwardConfig{.block_m = 64,
               .block_n = 128,
               .warps = 8,
               .kernel = kiln::AttentionBackwardKernel::wgmma}}) {
    check_refusal(refusal([&] { kiln::attention_backward_specs(wide, narrow); }),
                  ErrorCategory::unsupported,
                  {"takes head dims up to 128, not 128 and 136", "warps 8 over block_n 64"});
  }
  // The specs of a config that breaks the tile rules are refused as its call is.
  check_refusal(refusal([&] {
                  kiln::attention_backward_specs(wide,
                                                 {.block_m = 64,
                                                  .block_n = 128,
                                                  .warps = 2,
                                                  .kernel = kiln::AttentionBackwardKernel::wgmma});
                }),
                ErrorCategory::invalid_argument,
                {"(block_m 64, block_n 128, warps 2) breaks the kernel's tile rules"});
  kiln::AttentionBackwardConfig split_dims = wgmma;
  split_dims.warps = 8;
  CHECK(kiln::attention_backward_specs(wide, split_dims).size() == 3);
  wide.forward.head_dim_v = 264;
  check_refusal(refusal([&] { kiln::attention_backward_specs(wide, split_dims); }),
                ErrorCategory::unsupported, {"takes head dims up to 256, not 128 and 264"});
  // At head dim 64 (padded_call's), two warpgroups on 64 query rows would split dQ's 64
  // columns in two.
  kiln::AttentionBackwardConfig split = wgmma;
  split.block_n = 128;
  split.warps = 8;
  check_refusal(with(split, "sm_90a"), ErrorCategory::unsupported,
                {"splits head dim 64's dQ columns", "use block_m 128, or block_n 64 with warps 4"});
  // Its dk/dv kernel reads q and dout by TMA: a dout broadcast over the batch (stride 0, as
  // autograd hands out the gradient of a sum) cannot be tiled; choose()'s config takes the mma
  // kernels for it instead.
  const kiln::test::Refusal untiled = refusal([&] {
    kiln::TensorView dout = c.dout;
    dout.strides[0] = 0;
    kiln::attention_backward(c.q, c.k, c.v, c.out, dout, c.dq, c.dk, c.dv, c.options, c.grads,
                             wgmma, nullptr, validating_runtime("sm_90a"));
  });
  check_refusal(
      untiled, ErrorCategory::unsupported,
      {"the wgmma backward kernel cannot tile q", "strides (0,", "AttentionBackwardKernel::mma"});
  kiln::AttentionBackwardConfig none = mma;
  none.kernel = static_cast<kiln::AttentionBackwardKernel>(7);
  check_refusal(with(none, "sm_80"), ErrorCategory::invalid_argument,
                {"config.kernel is 7", "use mma or portable"});
}
