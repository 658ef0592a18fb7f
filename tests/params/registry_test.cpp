// SPDX-License-Identifier: Apache-2.0
// lib/params/registry.cpp: the schema of kiln's kernels, and every path that checks specs by it.
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "jit/manifest.hpp"
#include "kernels/decode.hpp"
#include "kiln/kiln.hpp"
#include "kiln/params/attention.h"
#include "kiln/params/decode.h"
#include "kiln/params/elementwise.h"
#include "ops/every_feature.hpp"
#include "params/registry.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

using detail::check_schema;

KernelSpec unary() {
  return unary_spec(UnaryOp::cos, DType::f32, {256, 4});
}

std::string refusal(const KernelSpec& spec) {
  try {
    check_schema(spec);
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::invalid_argument);
    return e.what();
  }
  FAIL(to_string(spec) << " was accepted");
  return {};
}

// Every spec the ops build, for every kernel of every family.
std::vector<KernelSpec> built_specs() {
  std::vector<KernelSpec> specs = unary_default_specs();
  for (const char* target : {"sm_80", "sm_90a", "gfx90a"}) {
    for (KernelSpec& spec : default_specs(target)) specs.push_back(std::move(spec));
  }
  const AttentionProblem all = every_attention_feature();
  for (AttentionKernel kernel :
       {AttentionKernel::mma, AttentionKernel::wgmma, AttentionKernel::portable}) {
    specs.push_back(attention_spec(all, {.kernel = kernel}));
  }
  const AttentionBackwardProblem backward{.forward = all, .dsinks = true, .dbias = true};
  for (AttentionBackwardKernel kernel :
       {AttentionBackwardKernel::mma, AttentionBackwardKernel::portable}) {
    for (KernelSpec& spec : attention_backward_specs(backward, {.kernel = kernel})) {
      specs.push_back(std::move(spec));
    }
  }
  const DecodeProblem decode{.head_dim = 128, .head_dim_v = 128, .append = true};
  for (KernelSpec& spec : decode_specs(decode, {})) specs.push_back(std::move(spec));
  return specs;
}

}  // namespace

TEST_CASE("every spec kiln's families build matches its kernel's schema", "[params][schema]") {
  std::set<std::string> entries;
  for (const KernelSpec& spec : built_specs()) {
    INFO(to_string(spec));
    REQUIRE(detail::kernel_schema(spec.entry) != nullptr);
    CHECK_NOTHROW(check_schema(spec));
    entries.insert(spec.entry);
  }
  // The default sets and the specs above reach all seventeen kernels (nine of them the
  // backward's: the row dots, the sinks' sum, the bias's gradient, and dk/dv and dq of portable,
  // mma and wgmma).
  CHECK(entries.size() == 17);
}

TEST_CASE("a spec missing a constant, or with one its kernel does not take, is refused",
          "[params][schema]") {
  KernelSpec missing = unary();
  std::erase_if(missing.constants, [](const Constant& c) {
    return c.name == "items_per_thread" || c.name == "block_size";
  });
  CHECK_THAT(refusal(missing),
             Catch::Contains("kernel spec " + to_string(missing) +
                             " is invalid: it lacks the constants block_size, items_per_thread; "
                             "kiln::unary takes exactly the constants block_size, dtype, "
                             "items_per_thread, op"));
  KernelSpec extra = unary();
  extra.set("fast", true).set("warps", 4);
  CHECK_THAT(refusal(extra),
             Catch::Contains("kiln::unary does not take the constants fast, warps"));

  KernelSpec mistyped = unary();
  mistyped.set("dtype", 4).set("op", true);
  CHECK_THAT(refusal(mistyped),
             Catch::Contains("constant dtype must be a dtype (f16, bf16, f32, f64, i32 or i64)") &&
                 Catch::Contains("constant op must be an integer"));

  KernelSpec params = unary();
  params.params = "kiln::AttentionParams";
  CHECK_THAT(refusal(params),
             Catch::Contains("kiln::unary takes kiln::UnaryParams, not 'kiln::AttentionParams'"));

  KernelSpec typo = unary();
  typo.entry = "kiln::unray";
  CHECK_THAT(refusal(typo), Catch::Contains("kiln has no kernel 'kiln::unray': use one of "
                                            "kiln::unary, kiln::attention_forward"));

  // A kernel of a caller's own tree is checked by its source alone.
  KernelSpec own = unary();
  own.entry = "mine::unary";
  own.set("anything", 1);
  CHECK_NOTHROW(check_schema(own));
  CHECK_FALSE(detail::dynamic_shared_bytes(own));
}

TEST_CASE("an enumeration constant out of its range is refused, naming every value",
          "[params][schema]") {
  for (const std::int64_t op :
       {std::int64_t{42}, std::int64_t{-1}, std::int64_t{unary_op::count}}) {
    KernelSpec spec = unary();
    spec.set("op", op);
    CHECK_THAT(refusal(spec),
               Catch::Contains(fmt::format("constant op is {}: it must be one of 0 (neg), 1 (abs), "
                                           "2 (exp)",
                                           op)) &&
                   Catch::Contains("10 (silu), 11 (sqrt)"));
  }
  for (int op = 0; op < unary_op::count; ++op) {
    CHECK(detail::value_name("kiln::unary", "op", op) == to_string(static_cast<UnaryOp>(op)));
  }
  CHECK(detail::value_name("kiln::unary", "op", unary_op::count).empty());
  CHECK(detail::value_name("kiln::unary", "block_size", 256).empty());
  CHECK(detail::value_name("mine::unary", "op", 4).empty());
}

TEST_CASE("the schema gives the dynamic shared memory the launches ask for", "[params][schema]") {
  const AttentionProblem problem{.head_dim = 128, .head_dim_v = 128};  // bf16
  const AttentionConfig mma = choose(problem, "sm_80");
  // round_up(128, 16) + 8 = 136 columns: 2 bytes * (128 * 136 + 1 stage * 64 * (136 + 136)).
  CHECK(detail::dynamic_shared_bytes(attention_spec(problem, mma)) == 2 * (128 * 136 + 64 * 272));
  const AttentionConfig tma = choose(problem, "sm_90a");
  REQUIRE(tma.kernel == AttentionKernel::tma);
  // At d128 the wgmma kernel's tiles and a staging tile of 128 rows of 136 columns.
  CHECK(attention_forward_tma_staged(128, 128, tma.block_m, tma.block_n, tma.stages, 2, 2, 2, 2));
  CHECK(
      detail::dynamic_shared_bytes(attention_spec(problem, tma)) ==
      attention_forward_wgmma_smem_bytes(128, 128, tma.block_m, tma.block_n, tma.stages, 2, 2, 2) +
          2 * 128 * 136);
  AttentionConfig wgmma = tma;
  wgmma.kernel = AttentionKernel::wgmma;
  CHECK(detail::dynamic_shared_bytes(attention_spec(problem, wgmma)) ==
        attention_forward_wgmma_smem_bytes(128, 128, wgmma.block_m, wgmma.block_n, wgmma.stages, 2,
                                           2, 2));
  // At d256 the staging tile does not fit beside the tiles: no extra memory.
  const AttentionProblem wide{.head_dim = 256, .head_dim_v = 256};
  const AttentionConfig tma256 = choose(wide, "sm_90a");
  CHECK_FALSE(attention_forward_tma_staged(256, 256, tma256.block_m, tma256.block_n, tma256.stages,
                                           2, 2, 2, 2));
  CHECK(detail::dynamic_shared_bytes(attention_spec(wide, tma256)) ==
        attention_forward_wgmma_smem_bytes(256, 256, tma256.block_m, tma256.block_n, tma256.stages,
                                           2, 2, 2));
  const AttentionConfig portable = choose(problem, "gfx90a");
  CHECK(detail::dynamic_shared_bytes(attention_spec(problem, portable)) ==
        attention_forward_portable_smem_bytes(128, 128, portable.block_n, 2));
  const DecodeProblem decode{.head_dim = 64, .head_dim_v = 64, .rows_per_kv_head = 8};
  const DecodeConfig config;
  CHECK(detail::dynamic_shared_bytes(detail::decode_attention_spec(decode, config)) ==
        attention_decode_smem_bytes(64, 64, config.m_tiles, config.block_n, config.warps,
                                    config.stages, 2, 2, false));
  CHECK(detail::dynamic_shared_bytes(unary()) == 0);
  CHECK(detail::dynamic_shared_bytes(detail::merge_spec(DType::f32, DType::bf16, 128)) == 0);
}

TEST_CASE("the shared-memory formulas take each operand's element size", "[params][schema]") {
  // A 1-byte K/V dtype (fp8 k and v) takes a byte an element, in unpadded rows, and leaves Q's
  // and the output's alone. mma at d128, 128 x 64, 2 stages: Q is 128 rows of 136 columns, a
  // stage 64 rows of 136 + 136 (fp8: 128 + 128).
  constexpr long long q_tile = 128 * 136, kv_tiles = 2 * 64 * 272;
  CHECK(attention_forward_smem_bytes(128, 128, 128, 64, 2, 2, 2, 2) == 2 * (q_tile + kv_tiles));
  CHECK(attention_forward_smem_bytes(128, 128, 128, 64, 2, 2, 1, 2) == 2 * q_tile + 2 * 64 * 256);
  CHECK(attention_forward_smem_bytes(128, 128, 128, 64, 2, 1, 2, 2) == q_tile + 2 * kv_tiles);
  // The output staging tile (128 rows of 136) reuses the tiles: it counts where it is larger.
  CHECK(attention_forward_smem_bytes(128, 128, 128, 16, 1, 1, 2, 4) == 4 * 128 * 136);
  // wgmma at d128, 128 x 128, 2 stages: Q 128 x 128, a stage 128 x (128 + 128), after 1 KiB.
  constexpr long long wq = 128 * 128, wkv = 2 * 128 * 256;
  CHECK(attention_forward_wgmma_smem_bytes(128, 128, 128, 128, 2, 2, 2, 2) ==
        1024 + 2 * (wq + wkv));
  CHECK(attention_forward_wgmma_smem_bytes(128, 128, 128, 128, 2, 2, 1, 2) == 1024 + 2 * wq + wkv);
  // tma stages its output (128 rows of 136) beside the tiles where they fit: at d128 with
  // 2-byte operands.
  CHECK(attention_forward_tma_smem_bytes(128, 128, 128, 128, 2, 2, 2, 2, 2) ==
        1024 + 2 * (wq + wkv) + 2 * 128 * 136);
  // 4-byte outputs would not fit their staging tile beside the tiles.
  CHECK(attention_forward_tma_smem_bytes(128, 128, 128, 128, 2, 2, 2, 2, 4) ==
        attention_forward_wgmma_smem_bytes(128, 128, 128, 128, 2, 2, 2, 4));
  CHECK_FALSE(attention_forward_tma_staged(256, 256, 128, 64, 2, 2, 2, 2, 2));
  // fp8 k and v under an f16 q on the tma kernel land in staging entries of a K or V block each,
  // in bytes, and are widened into slots of q's type: at d128 with 128 x 128 tiles in 2 stages, 4
  // entries of 128 rows of 128 bytes fit its budget (227 KiB less 1 KiB) without the output
  // staging tile; at d256 with 64 keys, 2 entries; a config with no room for one a stage has none.
  CHECK(attention_forward_tma_fp8_entries(128, 128, 128, 128, 2, 2, 2, 1, 2) == 4);
  CHECK_FALSE(attention_forward_tma_staged(128, 128, 128, 128, 2, 2, 2, 1, 2));
  CHECK(attention_forward_tma_smem_bytes(128, 128, 128, 128, 2, 2, 2, 1, 2) ==
        1024 + 2 * (wq + wkv) + 4 * 128 * 128);
  CHECK(attention_forward_tma_fp8_entries(256, 256, 128, 64, 2, 2, 2, 1, 2) == 2);
  CHECK(attention_forward_tma_smem_bytes(256, 256, 128, 64, 2, 2, 2, 1, 2) ==
        1024 + 2 * (128 * 256 + 2 * 64 * 512) + 2 * 64 * 256);
  CHECK(attention_forward_tma_fp8_entries(128, 128, 128, 176, 2, 2, 2, 1, 2) == 0);
  CHECK(attention_forward_tma_fp8_entries(128, 128, 128, 128, 2, 2, 2, 2, 2) == 0);  // 16-bit
  // A split q (bf16 over e4m3: Q K^T's operands of 1 byte) keeps its K in e4m3 slots (rows of
  // whole 128-byte chunks) and V alone in entries: at d128 with 128 x 128 tiles in 2 stages, 2
  // entries and the output staging tile fit.
  CHECK(attention_forward_tma_tile_bytes(128, 128, 128, 128, 2, 2, 1) ==
        128 * 256 + 2 * 128 * (128 + 2 * 128));
  CHECK(attention_forward_tma_fp8_entries(128, 128, 128, 128, 2, 2, 1, 1, 2) == 2);
  CHECK(attention_forward_tma_smem_bytes(128, 128, 128, 128, 2, 2, 1, 1, 2) ==
        1024 + 128 * 256 + 2 * 128 * 384 + 2 * 128 * 128 + 2 * 128 * 136);
  CHECK(attention_forward_tma_tile_bytes(160, 128, 128, 64, 2, 2, 1) ==
        128 * 192 * 2 + 2 * 64 * (256 + 2 * 128));
  CHECK(attention_forward_portable_smem_bytes(128, 64, 32, 2) ==
        2 * attention_forward_portable_smem_bytes(128, 64, 32, 1));
  // decode at d128, one row tile, 4 warps of 3 stages of 16 keys: Q 16 x 128, K/V 4 x 3 x 16 x
  // 256.
  CHECK(attention_decode_smem_bytes(128, 128, 1, 16, 4, 3, 2, 2, false) ==
        2 * (16 * 128 + 4 * 3 * 16 * 256));
  // An fp8 cache: its tiles in a byte an element (widened in registers); with descales per
  // token, each slot also holds its 16 keys' and 16 values' (fp32).
  CHECK(attention_decode_smem_bytes(128, 128, 1, 16, 4, 3, 2, 1, false) ==
        2 * 16 * 128 + 4 * 3 * 16 * 256);
  CHECK(attention_decode_smem_bytes(128, 128, 1, 16, 4, 3, 2, 1, true) ==
        2 * 16 * 128 + 4 * 3 * (16 * 256 + 2 * 16 * 4));
}

TEST_CASE("a spec of operand dtypes its family does not take is refused before compiling",
          "[params][schema]") {
  const AttentionProblem all = every_attention_feature();  // f16
  for (AttentionKernel kernel : {AttentionKernel::mma, AttentionKernel::wgmma, AttentionKernel::tma,
                                 AttentionKernel::portable}) {
    const KernelSpec spec = attention_spec(all, {.kernel = kernel});
    INFO(to_string(spec));
    KernelSpec mixed = spec;
    mixed.set("dtype_kv", DType::bf16);
    CHECK_THAT(refusal(mixed),
               Catch::Contains("dtype_kv has dtype bf16 but dtype_q has dtype f16: " + spec.entry +
                               " takes (q, k and v, out) in the dtypes (bf16, bf16, bf16) or "
                               "(f16, f16, f16)") &&
                   Catch::Contains("so dtype_kv needs f16"));
    // fp8 k and v: the mma and tma kernels'.
    KernelSpec fp8 = spec;
    fp8.set("dtype_kv", DType::e4m3);
    if (kernel == AttentionKernel::mma || kernel == AttentionKernel::tma) {
      CHECK_NOTHROW(check_schema(fp8));
    } else {
      CHECK_THAT(refusal(fp8),
                 Catch::Contains("dtype_kv has dtype e4m3 but dtype_q has dtype f16"));
    }
    mixed = spec;
    mixed.set("dtype_out", DType::f32);
    CHECK_THAT(refusal(mixed),
               Catch::Contains("dtype_out has dtype f32 but dtype_q has dtype f16"));
    KernelSpec f32 = spec;
    f32.set("dtype_q", DType::f32).set("dtype_kv", DType::f32).set("dtype_out", DType::f32);
    CHECK_THAT(refusal(f32),
               Catch::Contains("dtype_q has dtype f32: " + spec.entry + " takes bf16 or f16"));
  }
  const DecodeProblem decode{.head_dim = 128, .head_dim_v = 128, .append = true};
  for (const KernelSpec& spec : decode_specs(decode, {})) {  // decode_append, attention_decode
    INFO(to_string(spec));
    KernelSpec mixed = spec;
    mixed.set("dtype_kv", DType::f16);
    CHECK_THAT(refusal(mixed),
               Catch::Contains("dtype_kv has dtype f16 but dtype_q has dtype bf16"));
  }

  // Not compiled: the runtime refuses it with the compiler off, and a manifest names its line.
  const TempDir cache;
  const ScopedEnv target("KILN_TARGET", "sm_90a");
  Options options;
  options.cache_dir = cache.path();
  options.jit = JitMode::off;
  Runtime runtime(options);
  KernelSpec mixed = attention_spec(all, choose(all, "sm_90a"));
  mixed.set("dtype_kv", DType::bf16);
  const auto refused = Catch::Contains("dtype_kv has dtype bf16 but dtype_q has dtype f16");
  CHECK_THROWS_WITH(runtime.compile(mixed), refused);
  CHECK_THROWS_WITH(detail::parse_manifest(to_string(mixed) + "\n", "m.txt"),
                    Catch::StartsWith("m.txt:1: kernel spec ") && refused);
}

TEST_CASE("the runtime and manifests refuse a spec that breaks its schema before compiling",
          "[params][schema]") {
  const TempDir cache;
  const ScopedEnv target("KILN_TARGET", "sm_90a");
  Options options;
  options.cache_dir = cache.path();
  options.jit = JitMode::off;  // nothing may reach the compiler
  Runtime runtime(options);
  KernelSpec spec = unary();
  spec.set("fast", true);
  const auto refused = Catch::Contains("kiln::unary does not take the constants fast");
  CHECK_THROWS_WITH(runtime.key(spec), refused);
  CHECK_THROWS_WITH(runtime.compile(spec), refused);
  CHECK_THROWS_WITH(runtime.generated_source(spec), refused);
  const WarmupReport report = runtime.warmup(std::vector<KernelSpec>{spec});
  REQUIRE(report.items.size() == 1);
  CHECK(report.items[0].status == WarmupStatus::failed);
  CHECK_THAT(report.items[0].error, refused);

  const std::string manifest = "# ok\n" + to_string(unary()) + "\n" + to_string(spec) + "\n";
  CHECK_THROWS_WITH(detail::parse_manifest(manifest, "m.txt"),
                    Catch::StartsWith("m.txt:3: kernel spec ") && refused);
}

}  // namespace kiln::test
