// SPDX-License-Identifier: Apache-2.0
// kiln::attention() input validation, with no GPU: every bad input is refused with a kiln::Error
// that names the tensor and the values, before anything needs a device.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kiln/attention.hpp"
#include "kiln/error.hpp"
#include "ops/score.hpp"
#include "ops/validation_support.hpp"
#include "support.hpp"

namespace {

using kiln::DType;
using kiln::ErrorCategory;
using kiln::TensorView;
using kiln::test::check_refusal;
using kiln::test::fake;
using kiln::test::refusal;
using kiln::test::reshaped;
using kiln::test::validating_runtime;
using kiln::test::view;

struct Call {
  TensorView q, k, v, out;
  kiln::AttentionOptions options;
};

// A valid padded-batch GQA call: batch 2, seqlen_q 128, seqlen_k 256, 8 query heads on 2 kv
// heads, head dim 64.
Call padded_call(DType dtype = DType::bf16) {
  return {view(0x1000000, dtype, {2, 128, 8, 64}),
          view(0x2000000, dtype, {2, 256, 2, 64}),
          view(0x3000000, dtype, {2, 256, 2, 64}),
          view(0x4000000, dtype, {2, 128, 8, 64}),
          {}};
}

// A valid varlen call: 3 sequences, 100 query and 300 key tokens in all.
Call varlen_call() {
  Call c{view(0x1000000, DType::bf16, {100, 8, 64}),
         view(0x2000000, DType::bf16, {300, 2, 64}),
         view(0x3000000, DType::bf16, {300, 2, 64}),
         view(0x4000000, DType::bf16, {100, 8, 64}),
         {}};
  c.options.cu_seqlens_q = view(0x5000000, DType::i32, {4});
  c.options.cu_seqlens_k = view(0x6000000, DType::i32, {4});
  c.options.max_seqlen_q = 50;
  c.options.max_seqlen_k = 150;
  return c;
}

// The error attention() refuses `c` with; is_supported() must refuse it with the same message.
void check_refused(const Call& c, ErrorCategory category,
                   std::initializer_list<const char*> words) {
  check_refusal(
      refusal(
          [&] { kiln::attention(c.q, c.k, c.v, c.out, c.options, nullptr, validating_runtime()); },
          [&](std::string* why) {
            return kiln::is_supported(c.q, c.k, c.v, c.out, c.options, why, validating_runtime());
          }),
      category, words);
}

void check_invalid(const Call& c, std::initializer_list<const char*> words) {
  check_refused(c, ErrorCategory::invalid_argument, words);
}

// Whether `c` got through validation: it returned (nothing to do) or reached the kernel lookup,
// which fails here (no compiling, no driver or no device) naming the attention spec.
void check_accepted(const Call& c) {
  try {
    kiln::attention(c.q, c.k, c.v, c.out, c.options, nullptr, validating_runtime());
  } catch (const kiln::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.category() == ErrorCategory::not_found);
    CHECK_THAT(e.what(), Catch::Contains("attention/prefill/forward"));
  }
}

}  // namespace

TEST_CASE("attention is_supported() accepts a good problem and explains a refusal", "[attention]") {
  kiln::Runtime& rt = validating_runtime();
  const Call good = padded_call();
  std::string why;
  CHECK(kiln::is_supported(good.q, good.k, good.v, good.out, good.options, &why, rt));
  INFO("why: " << why);
  const Call varlen = varlen_call();
  CHECK(kiln::is_supported(varlen.q, varlen.k, varlen.v, varlen.out, varlen.options, nullptr, rt));

  Call bad = padded_call();
  bad.q = reshaped(bad.q, {2, 128, 8, 12});
  CHECK_FALSE(kiln::is_supported(bad.q, bad.k, bad.v, bad.out, bad.options, &why, rt));
  CHECK_THAT(why, Catch::Contains("head_dim") && Catch::Contains("12"));
  CHECK_FALSE(kiln::is_supported(bad.q, bad.k, bad.v, bad.out, bad.options, nullptr, rt));
}

TEST_CASE("attention passes valid calls of every layout and option", "[attention]") {
  check_accepted(padded_call());
  check_accepted(padded_call(DType::f16));
  check_accepted(varlen_call());

  Call bhsd = padded_call();  // (batch, heads, seqlen, d) memory seen through strides
  bhsd.q.strides = {8 * 128 * 64, 64, 128 * 64, 1};
  bhsd.out.strides = bhsd.q.strides;
  check_accepted(bhsd);

  Call packed = padded_call();  // q, k, v as slices of one (batch, seqlen, 3, heads, d) buffer
  packed.k = packed.v = packed.q = reshaped(packed.q, {2, 128, 8, 64});
  const std::array<std::int64_t, 4> packed_strides = {128 * 3 * 8 * 64, 3 * 8 * 64, 64, 1};
  for (TensorView* t : {&packed.q, &packed.k, &packed.v}) t->strides = packed_strides;
  packed.k.data = fake(0x1000000 + 8 * 64 * 2);
  packed.v.data = fake(0x1000000 + 2 * 8 * 64 * 2);
  check_accepted(packed);

  Call options = padded_call();
  options.options = {.score = {.softmax_scale = 0.5f,
                               .causal = true,
                               .window_left = 32,
                               .top_left = true,
                               .softcap = 30}};
  options.options.score.alibi_slopes = view(0x5000000, DType::f32, {2, 8});
  options.options.score.sinks = view(0x5100000, DType::f32, {8});
  options.options.lse = view(0x6000000, DType::f32, {2, 8, 128});
  options.options.seqused_k = view(0x7000000, DType::i32, {2});
  check_accepted(options);

  Call bias = padded_call();  // broadcast over batch by stride 0, keys strided (transposed)
  bias.options.bias = view(0x5000000, DType::bf16, {2, 8, 128, 256});
  bias.options.bias->strides = {0, 256 * 128, 1, 128};
  check_accepted(bias);
  bias.options.bias = view(0x5000000, DType::bf16, {1, 1, 128, 256});  // size 1 broadcasts too
  check_accepted(bias);

  Call varlen = varlen_call();
  varlen.options.lse = view(0x7000000, DType::f32, {8, 100});
  varlen.options.seqused_k = view(0x8000000, DType::i32, {3});
  check_accepted(varlen);

  // Size-1 dims may have any stride: nothing steps along them.
  Call single = padded_call();
  single.q = reshaped(single.q, {2, 1, 8, 64});
  single.out = reshaped(single.out, {2, 1, 8, 64});
  single.q.strides[1] = 3;
  check_accepted(single);

  // Nothing to compute: no error and no kernel lookup.
  Call empty = padded_call();
  empty.q = reshaped(empty.q, {2, 0, 8, 64});
  empty.out = reshaped(empty.out, {2, 0, 8, 64});
  CHECK_NOTHROW(
      kiln::attention(empty.q, empty.k, empty.v, empty.out, {}, nullptr, validating_runtime()));
  Call no_batch = padded_call();
  for (TensorView* t : {&no_batch.q, &no_batch.k, &no_batch.v, &no_batch.out}) t->shape[0] = 0;
  CHECK_NOTHROW(kiln::attention(no_batch.q, no_batch.k, no_batch.v, no_batch.out, {}, nullptr,
                                validating_runtime()));
}

TEST_CASE("attention refuses rank mismatches", "[attention]") {
  Call c = padded_call();
  c.k = reshaped(c.k, {512, 2, 64});
  check_invalid(c, {"k has rank 3 but q has rank 4"});

  c = padded_call();
  c.out = reshaped(c.out, {2, 128, 512});
  check_invalid(c, {"out has rank 3 but q has rank 4"});

  // Rank-3 tensors without cu_seqlens: the message points at varlen.
  c = varlen_call();
  c.options.cu_seqlens_q.reset();
  c.options.cu_seqlens_k.reset();
  check_invalid(c, {"q has rank 3 but must have rank 4", "cu_seqlens"});

  c = varlen_call();
  c.q = reshaped(c.q, {1, 100, 8, 64});
  check_invalid(c, {"q has rank 4 but must have rank 3", "total_tokens"});

  c = padded_call();
  c.q.rank = 0;
  check_invalid(c, {"q has rank 0"});
}

TEST_CASE("attention refuses shape mismatches, naming both sizes", "[attention]") {
  Call c = padded_call();
  c.k = reshaped(c.k, {3, 256, 2, 64});
  c.v = reshaped(c.v, {3, 256, 2, 64});
  check_invalid(c, {"k.size(0) is 3", "batch", "is 2"});

  c = padded_call();
  c.v = reshaped(c.v, {2, 255, 2, 64});
  check_invalid(c, {"v.size(1) is 255", "seqlen_k", "is 256"});

  c = padded_call();
  c.k = reshaped(c.k, {2, 256, 2, 72});
  check_invalid(c, {"k.size(-1) is 72", "head_dim", "is 64"});

  c = padded_call();
  c.v = reshaped(c.v, {2, 256, 4, 64});
  check_invalid(c, {"v.size(2) is 4", "heads_kv", "is 2"});

  c = padded_call();
  c.out = reshaped(c.out, {2, 127, 8, 64});
  check_invalid(c, {"out.size(1) is 127", "seqlen_q", "is 128"});

  c = padded_call();
  c.out = reshaped(c.out, {2, 128, 4, 64});
  check_invalid(c, {"out.size(2) is 4", "heads", "is 8"});

  // head_dim_v comes from v; out must follow it.
  c = padded_call();
  c.v = reshaped(c.v, {2, 256, 2, 128});
  check_invalid(c, {"out.size(-1) is 64", "head_dim_v", "is 128"});

  c = varlen_call();
  c.v = reshaped(c.v, {299, 2, 64});
  check_invalid(c, {"v.size(0) is 299", "total_k", "300"});

  c = varlen_call();
  c.out = reshaped(c.out, {101, 8, 64});
  check_invalid(c, {"out.size(0) is 101", "total_q", "100"});
}

TEST_CASE("attention refuses query heads that are not a multiple of the kv heads", "[attention]") {
  Call c = padded_call();
  c.k = reshaped(c.k, {2, 256, 3, 64});
  c.v = reshaped(c.v, {2, 256, 3, 64});
  check_invalid(c, {"q has 8 heads and k has 3", "multiple"});

  c.k = reshaped(c.k, {2, 256, 0, 64});
  c.v = reshaped(c.v, {2, 256, 0, 64});
  check_invalid(c, {"q has 8 heads and k has 0"});
}

TEST_CASE("attention refuses mixed and unsupported dtypes", "[attention]") {
  Call c = padded_call();
  c.k.dtype = DType::f16;
  check_invalid(c, {"k has dtype f16 but q has dtype bf16: attention takes (q, k and v, out) in "
                    "the dtypes (bf16, bf16, bf16) or (f16, f16, f16) or (bf16, e4m3, bf16) or "
                    "(f16, e4m3, f16) or (bf16, e5m2, bf16) or (f16, e5m2, f16) or (e4m3, e4m3, "
                    "bf16) or (e4m3, e4m3, f16), so k needs bf16"});
  c = padded_call();
  c.k.dtype = DType::e4m3;
  check_invalid(c, {"v has dtype bf16 but k has dtype e4m3", "so v needs e4m3"});
  c.v.dtype = DType::e5m2;
  check_invalid(c, {"v has dtype e5m2 but k has dtype e4m3", "so v needs e4m3"});

  c = padded_call(DType::f16);
  c.v.dtype = DType::bf16;
  check_invalid(c, {"v has dtype bf16 but q has dtype f16", "so v needs f16"});

  c = padded_call();
  c.out.dtype = DType::f32;
  check_invalid(c, {"out has dtype f32 but q has dtype bf16"});

  // f32 everywhere is consistent but not something the kernel takes.
  check_refused(padded_call(DType::f32), ErrorCategory::unsupported,
                {"q has dtype f32", "bf16 or f16"});
}

// is_supported() answers as the call would: on a GPU of another target than the runtime's
// (Options::target), the kernel could not load there. Without a GPU (or on an sm_80 one) it
// accepts.
TEST_CASE("is_supported() refuses a call whose kernels cannot load on the runtime's device",
          "[attention]") {
  const Call c = padded_call();
  std::string why;
  const bool supported =
      kiln::is_supported(c.q, c.k, c.v, c.out, c.options, &why, validating_runtime("sm_80"));
  if (kiln::test::gpu_unavailable_reason() ||
      validating_runtime("sm_80").device_info().target == "sm_80") {
    CHECK(supported);
  } else {
    CHECK_FALSE(supported);
    CHECK_THAT(why, Catch::Contains("whose target is"));
  }
}

TEST_CASE("attention takes fp8 k and v on the mma kernel of sm_89 and newer, and tma on sm_90a",
          "[attention]") {
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    INFO(kiln::to_string(fp8));
    Call c = padded_call();
    c.k.dtype = c.v.dtype = fp8;
    check_accepted(c);
    c.options.k_descale = view(0x5000000, DType::f32, {2, 2});
    c.options.v_descale = view(0x6000000, DType::f32, {2, 2});
    check_accepted(c);
    const kiln::AttentionProblem problem{
        .dtype_q = DType::bf16, .dtype_kv = fp8, .head_dim = 128, .head_dim_v = 128};
    CHECK(kiln::choose(problem, kiln::Target("sm_90a")).kernel == kiln::AttentionKernel::tma);
    CHECK(kiln::choose(problem, kiln::Target("sm_90")).kernel == kiln::AttentionKernel::mma);
    CHECK(kiln::choose(problem, kiln::Target("sm_89")).kernel == kiln::AttentionKernel::mma);
    // Below the tma kernel's head dims, and where its staging entries leave no room for the
    // long-key tiles of bf16 (176 keys), mma's and 128 keys.
    kiln::AttentionProblem narrow = problem;
    narrow.head_dim = narrow.head_dim_v = 48;
    CHECK(kiln::choose(narrow, kiln::Target("sm_90a")).kernel == kiln::AttentionKernel::mma);
    kiln::AttentionProblem long_keys = problem;
    long_keys.seqlen_k = 1 << 20;
    CHECK(kiln::choose(long_keys, kiln::Target("sm_90a")).block_n == 128);
    for (const char* target : {"sm_80", "sm_86", "gfx90a"}) {
      check_refusal(refusal([&] { kiln::choose(problem, kiln::Target(target)); }),
                    ErrorCategory::unsupported,
                    {"needs an sm_89 or newer GPU (its fp8 conversions)", target});
    }
    // The mma and tma kernels read fp8 (a validating runtime accepts the call up to the kernel's
    // load: with no GPU it needs one, with one it is not cached); the others refuse it.
    check_refusal(
        refusal([&] {
          kiln::attention(
              c.q, c.k, c.v, c.out, c.options,
              {.block_m = 128, .block_n = 128, .stages = 2, .kernel = kiln::AttentionKernel::tma},
              nullptr, validating_runtime());
        }),
        ErrorCategory::not_found, {"attention_forward_tma"});
    for (kiln::AttentionKernel kernel :
         {kiln::AttentionKernel::wgmma, kiln::AttentionKernel::portable}) {
      const kiln::AttentionConfig config{
          .block_m = 128, .block_n = 64, .stages = 2, .kernel = kernel};
      check_refusal(
          refusal([&] {
            kiln::attention(c.q, c.k, c.v, c.out, c.options, config, nullptr, validating_runtime());
          }),
          ErrorCategory::unsupported,
          {"k and v run on the mma and tma attention kernels only", "AttentionKernel::mma"});
    }
  }
  // On sm_80 the call is refused before anything compiles.
  Call c = padded_call();
  c.k.dtype = c.v.dtype = DType::e4m3;
  check_refusal(refusal([&] {
                  kiln::attention(c.q, c.k, c.v, c.out, c.options, nullptr,
                                  validating_runtime("sm_80"));
                }),
                ErrorCategory::unsupported, {"an e4m3 K/V needs an sm_89 or newer GPU", "sm_80"});
  // fp8 rows are copied as whole 16-byte pieces: head dims multiples of 16.
  c.q = reshaped(c.q, {2, 128, 8, 72});
  c.k = reshaped(c.k, {2, 256, 2, 72});
  c.k.strides = {256 * 2 * 80, 2 * 80, 80, 1};  // rows 16-byte aligned
  check_refused(c, ErrorCategory::unsupported,
                {"head_dim 72 and head_dim_v 64 with an e4m3 K/V", "multiples of 16"});
}

TEST_CASE("attention takes e4m3 q, k and v with a 16-bit out on sm_90a's tma kernel alone",
          "[attention]") {
  Call c = padded_call();
  c.q.dtype = c.k.dtype = c.v.dtype = DType::e4m3;
  check_accepted(c);
  c.out.dtype = DType::f16;
  check_accepted(c);
  c.options.q_descale = view(0x4000000, DType::f32, {2, 2});
  c.options.k_descale = view(0x5000000, DType::f32, {2, 2});
  c.options.v_descale = view(0x6000000, DType::f32, {2, 2});
  check_accepted(c);
  const kiln::AttentionProblem problem{
      .dtype_q = DType::e4m3, .dtype_kv = DType::e4m3, .head_dim = 128, .head_dim_v = 128};
  const kiln::AttentionConfig chosen = kiln::choose(problem, kiln::Target("sm_90a"));
  CHECK(chosen.kernel == kiln::AttentionKernel::tma);
  CHECK(chosen.block_n % 128 == 0);  // V is transposed in 128-key chunks
  for (const char* target : {"sm_90", "sm_89", "sm_80", "gfx90a"}) {
    check_refusal(refusal([&] { kiln::choose(problem, kiln::Target(target)); }),
                  ErrorCategory::unsupported, {"runs on sm_90a (H100, H200) only", target});
  }
  for (kiln::AttentionKernel kernel : {kiln::AttentionKernel::mma, kiln::AttentionKernel::wgmma,
                                       kiln::AttentionKernel::portable}) {
    const kiln::AttentionConfig config{
        .block_m = 128, .block_n = 64, .warps = 4, .stages = 2, .kernel = kernel};
    check_refusal(refusal([&] {
                    kiln::attention(c.q, c.k, c.v, c.out, c.options, config, nullptr,
                                    validating_runtime());
                  }),
                  ErrorCategory::unsupported, {"an e4m3 q runs on the tma attention kernel only"});
  }
  // head_dim_v 256 (P V 128 columns at a time): accepted.
  Call wide_v = c;
  wide_v.v = reshaped(wide_v.v, {2, 256, 2, 256});
  wide_v.out = reshaped(wide_v.out, {2, 128, 8, 256});
  check_accepted(wide_v);
  // tma tiles the all-fp8 forward cannot take: refused before any compile, naming the rule.
  const auto tiles = [](int block_m, int block_n) {
    return kiln::AttentionConfig{
        .block_m = block_m, .block_n = block_n, .stages = 2, .kernel = kiln::AttentionKernel::tma};
  };
  for (const auto& [call, config] : {std::pair{c, tiles(192, 128)},
                                     {c, tiles(128, 64)},
                                     {c, tiles(128, 192)},
                                     {wide_v, tiles(128, 256)}}) {
    INFO("block_m " << config.block_m << ", block_n " << config.block_n);
    check_refusal(refusal([&] {
                    kiln::attention(call.q, call.k, call.v, call.out, call.options, config, nullptr,
                                    validating_runtime());
                  }),
                  ErrorCategory::unsupported,
                  {"cannot take", "block_m 128 and block_n 128, or 256 up to head_dim_v 128"});
  }
  // Out in fp8, k and v in another dtype, a bias: refused.
  Call bad = c;
  bad.out.dtype = DType::e4m3;
  check_invalid(bad, {"out has dtype e4m3 but q has dtype e4m3", "so out needs bf16"});
  bad = c;
  bad.k.dtype = bad.v.dtype = DType::e5m2;
  check_invalid(bad, {"k has dtype e5m2 but q has dtype e4m3", "so k needs e4m3"});
  bad = c;
  bad.options.bias = view(0x8000000, DType::e4m3, {2, 8, 128, 256});
  check_refused(bad, ErrorCategory::unsupported, {"bias with an e4m3 q is not supported yet"});
  // TMA must tile an fp8 q's inputs: a broadcast k (stride 0) is refused, by is_supported() too.
  bad = c;
  bad.k.strides[0] = 0;
  check_refused(bad, ErrorCategory::unsupported,
                {"the tma kernel, the only one with fp8 products, cannot tile"});
  std::string why;
  CHECK_FALSE(
      kiln::is_supported(bad.q, bad.k, bad.v, bad.out, bad.options, &why, validating_runtime()));
  CHECK_THAT(why, Catch::Contains("cannot tile"));
  // q_descale: an fp8 q's, of (batch, heads_kv).
  bad = c;
  bad.options.q_descale = view(0x4000000, DType::f32, {2, 8});
  check_invalid(bad, {"q_descale.size(-1) is 8 but k.size(2) (heads_kv) is 2"});
  Call wide = padded_call();
  wide.options.q_descale = view(0x4000000, DType::f32, {2, 2});
  check_invalid(wide, {"q_descale is for an fp8 q, but q has dtype bf16: drop q_descale"});
}

TEST_CASE("attention refuses descales of the wrong shape or dtype, or with 16-bit k and v",
          "[attention]") {
  Call c = padded_call();
  c.options.k_descale = view(0x5000000, DType::f32, {2, 2});
  check_invalid(c, {"k_descale is for fp8 k and v, but k has dtype bf16: drop k_descale"});
  c.k.dtype = c.v.dtype = DType::e4m3;
  c.options.v_descale = view(0x6000000, DType::f32, {2});
  check_invalid(c, {"v_descale has rank 1", "(batch, heads_kv) fp32 descales"});
  c.options.v_descale = view(0x6000000, DType::bf16, {2, 2});
  check_invalid(c, {"v_descale has dtype bf16: it must be float32"});
  c.options.v_descale = view(0x6000000, DType::f32, {2, 8});
  check_invalid(c, {"v_descale.size(-1) is 8 but k.size(2) (heads_kv) is 2"});
  c.options.v_descale = std::nullopt;
  c.options.k_descale = view(0x5000000, DType::f32, {3, 2});
  check_invalid(c, {"k_descale.size(0) is 3", "q.size(0) (batch)"});
  // Varlen: a descale per sequence.
  Call v = varlen_call();
  v.k.dtype = v.v.dtype = DType::e4m3;
  v.options.k_descale = view(0x7000000, DType::f32, {2, 2});
  check_invalid(v, {"k_descale.size(0) is 2", "cu_seqlens_q.size(0) - 1 (batch)"});
  v.options.k_descale = view(0x7000000, DType::f32, {3, 2});
  v.options.k_descale->strides = {0, 1};  // one descale per kv head, broadcast over sequences
  check_accepted(v);
}

TEST_CASE("attention refuses a non-contiguous last dim, misalignment and negative strides",
          "[attention]") {
  Call c = padded_call();
  c.q.strides[3] = 2;
  check_invalid(c, {"q.stride(-1) is 2: the last dim must be contiguous"});

  c = padded_call();
  c.out.strides[3] = 0;
  check_invalid(c, {"out.stride(-1) is 0"});

  c = padded_call();
  c.k.strides[1] = 2 * 64 + 4;  // 16-byte rows need multiples of 8 elements
  check_invalid(c, {"k.stride(1) is 132", "multiple", "8 elements"});

  c = padded_call();
  c.v.data = fake(0x3000008);
  check_invalid(c, {"v's data pointer", "16-byte aligned"});

  c = padded_call();
  c.q.strides[1] = -512;
  check_invalid(c, {"q.stride(1) is -512", "negative"});
}

TEST_CASE("attention refuses null data pointers and negative sizes", "[attention]") {
  Call c = padded_call();
  c.q.data = nullptr;
  check_invalid(c, {"q has a null data pointer", std::to_string(2 * 128 * 8 * 64).c_str()});

  c = padded_call();
  c.options.lse = TensorView::contiguous(nullptr, DType::f32, {2, 8, 128});
  check_invalid(c, {"lse has a null data pointer"});

  c = padded_call();
  c.k.shape[1] = -5;
  check_invalid(c, {"k.size(1) is -5", "negative"});
}

TEST_CASE("attention refuses sizes beyond int32 and spans beyond 64-bit offsets", "[attention]") {
  constexpr std::int64_t big = std::int64_t{1} << 31;
  Call c = padded_call();
  c.q = reshaped(c.q, {1, big, 8, 64});
  c.out = reshaped(c.out, {1, big, 8, 64});
  c.k = reshaped(c.k, {1, 256, 2, 64});
  c.v = reshaped(c.v, {1, 256, 2, 64});
  check_invalid(c, {"q.size(1) is 2147483648", "2147483647"});

  c = padded_call();
  c.k = reshaped(c.k, {2, big, 2, 64});
  c.v = reshaped(c.v, {2, big, 2, 64});
  check_invalid(c, {"k.size(1) is 2147483648"});

  c = varlen_call();
  c.q = reshaped(c.q, {big, 8, 64});
  c.out = reshaped(c.out, {big, 8, 64});
  check_invalid(c, {"q.size(0) is 2147483648"});

  c = padded_call();
  c.q.strides[0] = std::int64_t{1} << 62;
  check_invalid(c, {"q", "64-bit offsets"});
}

// NOTE: a size-1 dim adds nothing to the span validation bounds, so its stride may be as large
// as int64 holds; the check of whether TMA can tile it must not overflow (UBSan).
TEST_CASE("attention takes a size-1 dim of stride 2^62 + 8 without TMA", "[attention]") {
  Call c = padded_call();
  c.q = reshaped(c.q, {1, 128, 8, 64});
  c.k = reshaped(c.k, {1, 256, 2, 64});
  c.v = reshaped(c.v, {1, 256, 2, 64});
  c.out = reshaped(c.out, {1, 128, 8, 64});
  c.q.strides[0] = (std::int64_t{1} << 62) + 8;
  const kiln::AttentionConfig config =
      kiln::choose({.head_dim = 64, .head_dim_v = 64}, kiln::Target("sm_90a"));
  REQUIRE(config.kernel == kiln::AttentionKernel::tma);
  check_accepted(c);  // choose()'s tma config, run by the wgmma kernel
  check_refusal(refusal([&] {
                  kiln::attention(c.q, c.k, c.v, c.out, c.options, config, nullptr,
                                  validating_runtime());
                }),
                ErrorCategory::unsupported,
                {"the tma kernel cannot tile q", "use the wgmma kernel (AttentionKernel::wgmma)"});
  // fp8 k and v: the wgmma kernel reads none, so the mma kernel runs them.
  c.k.dtype = c.v.dtype = DType::e4m3;
  check_accepted(c);
  check_refusal(refusal([&] {
                  kiln::attention(c.q, c.k, c.v, c.out, c.options, config, nullptr,
                                  validating_runtime());
                }),
                ErrorCategory::unsupported,
                {"the tma kernel cannot tile q", "use the mma kernel (AttentionKernel::mma)"});
}

TEST_CASE("attention refuses null tensors whose element count overflows int64", "[attention]") {
  // 2^15 x 2^30 x 2^15 x 256 elements (2^68) wrap to 0 in int64: with stride 0 they span one
  // row, so nothing else refuses them, and a wrapped count would pass them on to the kernel.
  Call c = padded_call();
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) {
    *t = TensorView::contiguous(nullptr, DType::bf16, {1 << 15, 1 << 30, 1 << 15, 256});
    t->strides = {0, 0, 0, 1};
  }
  check_invalid(c, {"q has a null data pointer", "more than 2^63"});
}

TEST_CASE("attention refuses outputs whose elements share addresses", "[attention]") {
  Call c = padded_call();
  c.out.strides[0] = 0;  // both sequences into one
  check_invalid(c, {"out.stride(0) is 0", "out.size(0) is 2", "one address", "contiguous"});

  c = padded_call();
  c.out.strides[1] = 256;  // a token's 8 heads span 512 elements
  check_invalid(c, {"out.stride(1) is 256", "512 elements", "overlap"});

  c = padded_call();
  c.options.lse = view(0x5000000, DType::f32, {2, 8, 128});
  c.options.lse->strides[1] = 0;
  check_invalid(c, {"lse.stride(1) is 0", "lse.size(1) is 8"});

  c = varlen_call();
  c.options.lse = view(0x5000000, DType::f32, {8, 100});
  c.options.lse->strides[0] = 50;
  check_invalid(c, {"lse.stride(0) is 50", "100 elements"});

  // Inputs may broadcast, and outputs may take any layout that does not overlap: BHSD, padded
  // rows, and a stride-0 dim of size 1.
  c = padded_call();
  c.k.strides[0] = 0;
  c.v.strides[0] = 0;
  check_accepted(c);
  c = padded_call();
  c.out.strides = {8 * 128 * 64, 64, 128 * 64, 1};
  c.options.lse = view(0x5000000, DType::f32, {2, 8, 128});
  c.options.lse->strides = {8 * 136, 136, 1};
  check_accepted(c);
  c = padded_call();
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) *t = reshaped(*t, {1, t->size(1), 8, 64});
  c.out.strides[0] = 0;
  check_accepted(c);
}

TEST_CASE("attention refuses dtype codes that are no kiln::DType", "[attention]") {
  Call c = padded_call();
  c.v.dtype = static_cast<DType>(77);
  check_invalid(c, {"v has dtype code 77", "kiln::DType"});
}

TEST_CASE("TensorView::contiguous refuses shapes whose strides overflow int64", "[attention]") {
  constexpr std::int64_t big = std::int64_t{1} << 40;
  const auto r = refusal([] { TensorView::contiguous(fake(0x1000), DType::bf16, {2, big, big}); });
  check_refusal(r, ErrorCategory::invalid_argument, {"(2, 1099511627776, 1099511627776)", "int64"});
  // Dim 0's size enters no stride.
  const TensorView wide =
      TensorView::contiguous(fake(0x1000), DType::bf16, {std::int64_t{1} << 62, big});
  CHECK(wide.strides[0] == big);
}

TEST_CASE("attention refuses grids the launch cannot express, before any kernel lookup",
          "[attention]") {
  // gridDim.y and .z stop at 65535. While the launch puts batch and heads there, attention()
  // must refuse more before it looks a kernel up, and is_supported() must agree (refusal()
  // checks both). A launch that folds them into gridDim.x would move this case to the GPU tests.
  Call c = padded_call();
  for (TensorView* t : {&c.q, &c.k, &c.v, &c.out}) *t = reshaped(*t, {70000, 1, t->size(2), 64});
  check_refused(c, ErrorCategory::unsupported, {"70000", "65535"});
}

TEST_CASE("attention refuses head dims it does not compile", "[attention]") {
  for (std::int64_t dim : {12, 0, 4, 264, 512}) {
    INFO("head_dim " << dim);
    Call c = padded_call();
    c.q = reshaped(c.q, {2, 128, 8, dim});
    c.k = reshaped(c.k, {2, 256, 2, dim});
    check_refused(c, ErrorCategory::unsupported,
                  {"head_dim", std::to_string(dim).c_str(), "multiple of 8 from 8 to 256"});
  }
  Call c = padded_call();
  c.v = reshaped(c.v, {2, 256, 2, 20});
  c.out = reshaped(c.out, {2, 128, 8, 20});
  check_refused(c, ErrorCategory::unsupported, {"head_dim_v", "20", "multiple of 8"});
}

TEST_CASE("attention refuses tensors on another device than the runtime's", "[attention]") {
  Call c = padded_call();
  c.k.device = 1;
  check_invalid(c, {"k is on device 1", "device is 0"});

  c = padded_call();
  c.options.lse = view(0x5000000, DType::f32, {2, 8, 128});
  c.options.lse->device = 3;
  check_invalid(c, {"lse is on device 3"});
}

TEST_CASE("attention refuses an lse of the wrong shape or dtype", "[attention]") {
  Call c = padded_call();
  c.options.lse = view(0x5000000, DType::f32, {2, 8, 127});
  check_invalid(c, {"lse.size(-1) is 127", "seqlen_q", "128"});
  c.options.lse = view(0x5000000, DType::f32, {2, 2, 128});
  check_invalid(c, {"lse.size(1) is 2", "heads", "8"});
  c.options.lse = view(0x5000000, DType::f32, {16, 128});
  check_invalid(c, {"lse has rank 2 but must have rank 3", "(batch, heads, seqlen_q)"});
  c.options.lse = view(0x5000000, DType::bf16, {2, 8, 128});
  check_invalid(c, {"lse has dtype bf16", "f32"});
  c.options.lse = view(0x5000000, DType::f32, {2, 8, 128});
  c.options.lse->strides[2] = 2;
  check_invalid(c, {"lse.stride(-1) is 2"});

  c = varlen_call();
  c.options.lse = view(0x7000000, DType::f32, {8, 99});
  check_invalid(c, {"lse.size(-1) is 99", "total_q", "100"});
  c.options.lse = view(0x7000000, DType::f32, {3, 8, 50});
  check_invalid(c, {"lse has rank 3 but must have rank 2", "(heads, total_q)"});
}

TEST_CASE("attention refuses alibi slopes of the wrong shape or dtype", "[attention]") {
  Call c = padded_call();
  c.options.score.alibi_slopes = view(0x5000000, DType::f32, {4});
  check_invalid(c, {"alibi_slopes.size(-1) is 4", "heads", "8"});
  c.options.score.alibi_slopes = view(0x5000000, DType::f32, {3, 8});
  check_invalid(c, {"alibi_slopes.size(0) is 3", "batch", "2"});
  c.options.score.alibi_slopes = view(0x5000000, DType::f32, {1, 2, 8});
  check_invalid(c, {"alibi_slopes has rank 3", "(heads) or (batch, heads)"});
  c.options.score.alibi_slopes = view(0x5000000, DType::bf16, {8});
  check_invalid(c, {"alibi_slopes has dtype bf16", "f32"});
}

TEST_CASE("attention refuses sinks of the wrong shape, dtype, stride or alignment", "[attention]") {
  Call c = padded_call();
  c.options.score.sinks = view(0x5000000, DType::f32, {4});
  check_invalid(c, {"sinks.size(-1) is 4", "heads", "8"});
  c.options.score.sinks = view(0x5000000, DType::f32, {2, 8});
  check_invalid(c, {"sinks has rank 2", "(heads)"});
  c.options.score.sinks = view(0x5000000, DType::bf16, {8});
  check_invalid(c, {"sinks has dtype bf16", "f32"});
  c.options.score.sinks = view(0x5000000, DType::f32, {8});
  c.options.score.sinks->strides = {2};
  check_invalid(c, {"sinks.stride(-1) is 2", "1"});
  c.options.score.sinks = view(0x5000002, DType::f32, {8});
  check_invalid(c, {"sinks", "aligned"});
}

TEST_CASE("attention refuses a bias of the wrong rank, shape or dtype, and with varlen",
          "[attention]") {
  Call c = padded_call();
  c.options.bias = view(0x5000000, DType::bf16, {8, 128, 256});
  check_invalid(c, {"bias has rank 3 but must have rank 4", "(batch, heads, seqlen_q, seqlen_k)"});
  c.options.bias = view(0x5000000, DType::f16, {2, 8, 128, 256});
  check_invalid(c, {"bias has dtype f16 but q has dtype bf16"});
  c.options.bias = view(0x5000000, DType::bf16, {2, 8, 128, 255});
  check_invalid(c, {"bias.size(-1) is 255", "seqlen_k", "256"});
  c.options.bias = view(0x5000000, DType::bf16, {2, 8, 1, 256});  // rows do not broadcast
  check_invalid(c, {"bias.size(2) is 1", "seqlen_q", "128"});
  c.options.bias = view(0x5000000, DType::bf16, {3, 8, 128, 256});
  check_invalid(c, {"bias.size(0) is 3", "batch", "2"});

  c = varlen_call();
  c.options.bias = view(0x7000000, DType::bf16, {3, 8, 50, 150});
  check_refused(c, ErrorCategory::unsupported, {"bias with varlen is not supported"});
}

TEST_CASE("attention refuses incomplete or malformed varlen arguments", "[attention]") {
  Call c = varlen_call();
  c.options.cu_seqlens_k.reset();
  check_invalid(c, {"cu_seqlens_k is missing"});
  c = varlen_call();
  c.options.cu_seqlens_q.reset();
  check_invalid(c, {"cu_seqlens_q is missing"});

  c = varlen_call();
  c.options.max_seqlen_q = 0;
  check_invalid(c, {"max_seqlen_q", "is 0"});
  c.options.max_seqlen_q = 200;
  check_invalid(c, {"max_seqlen_q is 200", "100 tokens"});

  c = varlen_call();
  c.options.cu_seqlens_q->dtype = DType::i64;
  check_invalid(c, {"cu_seqlens_q has dtype i64", "int32"});
  c = varlen_call();
  c.options.cu_seqlens_k = view(0x6000000, DType::i32, {3});
  check_invalid(c, {"cu_seqlens_k", "is 3", "4"});
  c = varlen_call();
  c.options.cu_seqlens_q = view(0x5000000, DType::i32, {2, 2});
  check_invalid(c, {"cu_seqlens_q has rank 2 but must have rank 1"});

  c = varlen_call();
  c.options.seqused_k = view(0x8000000, DType::i32, {2});
  check_invalid(c, {"seqused_k", "is 2", "3"});
  c.options.seqused_k = view(0x8000000, DType::i64, {3});
  check_invalid(c, {"seqused_k has dtype i64", "int32"});

  // max_seqlen_* without cu_seqlens means the caller thinks this is varlen.
  c = padded_call();
  c.options.max_seqlen_q = 128;
  check_invalid(c, {"max_seqlen_q", "varlen"});
}

TEST_CASE("attention refuses windows below -1", "[attention]") {
  Call c = padded_call();
  c.options.score.window_left = -2;
  check_invalid(c, {"window (-2, -1)", "below -1"});
  c.options.score.window_left = 16;
  c.options.score.window_right = -7;
  check_invalid(c, {"window (16, -7)", "below -1"});
  c.options = {.score = {.causal = true, .window_right = -2}};
  check_invalid(c, {"window (-1, -2)", "below -1"});
}

TEST_CASE("attention takes causal as window_right 0 whatever window_right says, as FlashAttention",
          "[attention]") {
  // Hugging Face transformers' sliding-window layers: causal with (w - 1, w - 1).
  for (int window_right : {-1, 0, 5, 4095}) {
    INFO("window_right " << window_right);
    Call c = padded_call();
    c.options = {.score = {.causal = true, .window_left = 4095, .window_right = window_right}};
    std::string why;
    CHECK(kiln::is_supported(c.q, c.k, c.v, c.out, c.options, &why, validating_runtime()));
    INFO("why: " << why);
    check_accepted(c);
    const kiln::ScoreParams p = kiln::detail::score_params(c.options.score, 2, 8, 64, 0);
    CHECK(p.window_left == 4095);
    CHECK(p.window_right == 0);
  }
}

TEST_CASE("attention refuses a negative or non-finite softcap and a non-positive scale",
          "[attention]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Call c = padded_call();
  c.options.score.softcap = -1;
  check_invalid(c, {"softcap is -1", "positive"});
  c.options.score.softcap = nan;
  check_invalid(c, {"softcap is nan"});
  c.options.score.softcap = inf;
  check_invalid(c, {"softcap is inf"});

  c = padded_call();
  c.options.score.softmax_scale = nan;
  check_invalid(c, {"softmax_scale is nan", "finite"});
  c.options.score.softmax_scale = -inf;
  check_invalid(c, {"softmax_scale is -inf", "finite"});
  c.options.score.softmax_scale = 0;
  check_invalid(c, {"softmax_scale is 0", "positive"});
  c.options.score.softmax_scale = -0.125f;
  check_invalid(c, {"softmax_scale is -0.125", "positive"});
}

TEST_CASE("attention refuses misaligned pointers of its small tensors", "[attention]") {
  // The kernel reads bias as 2-byte, slopes, lse and offsets as 4-byte elements: a pointer off
  // that grid faults on the device (misaligned address) instead of giving an error here.
  Call c = padded_call();
  c.options.bias = view(0x5000001, DType::bf16, {2, 8, 128, 256});
  check_invalid(c, {"bias", "aligned"});
  c = padded_call();
  c.options.score.alibi_slopes = view(0x5000002, DType::f32, {8});
  check_invalid(c, {"alibi_slopes", "aligned"});
  c = padded_call();
  c.options.lse = view(0x5000002, DType::f32, {2, 8, 128});
  check_invalid(c, {"lse", "aligned"});
  c = varlen_call();
  c.options.cu_seqlens_k = view(0x6000002, DType::i32, {4});
  check_invalid(c, {"cu_seqlens_k", "aligned"});
}
