// SPDX-License-Identifier: Apache-2.0
// include/kiln/params/score.h and lib/ops/score.cpp: the one score model every attention family
// holds, its ABI, the header JIT compiles get, and the function that fills it.
#include <catch2/catch.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "jit/sources.hpp"
#include "jit/unit.hpp"
#include "kiln/kiln.hpp"
#include "kiln/params/attention.h"
#include "kiln/params/decode.h"
#include "ops/score.hpp"
#include "params/registry.hpp"
#include "support.hpp"

namespace kiln::test {
namespace {

// NOTE: kernels read these bytes as the host wrote them, so the layout is part of the ABI of
// every Params that holds it: a change here is a change of all of them.
static_assert(std::is_standard_layout_v<ScoreParams> && std::is_trivially_copyable_v<ScoreParams>);
static_assert(std::same_as<decltype(AttentionParams::score), ScoreParams>);
static_assert(std::same_as<decltype(DecodeParams::score), ScoreParams>);

// A call of batch 2, 8 heads, head dim 64, on device 0.
ScoreParams filled(const ScoreOptions& o) {
  return detail::score_params(o, 2, 8, 64, 0);
}

}  // namespace

TEST_CASE("ScoreParams has one layout, on the host and in the registry", "[params][score]") {
  CHECK(sizeof(ScoreParams) == 304);
  CHECK(alignof(ScoreParams) == 8);
  CHECK(offsetof(ScoreParams, softmax_scale) == 0);
  CHECK(offsetof(ScoreParams, window_left) == 4);
  CHECK(offsetof(ScoreParams, window_right) == 8);
  CHECK(offsetof(ScoreParams, top_left) == 12);
  CHECK(offsetof(ScoreParams, softcap) == 16);
  CHECK(offsetof(ScoreParams, maybe_alibi_slopes) == 24);
  CHECK(offsetof(ScoreParams, alibi_batch_stride) == 32);
  CHECK(offsetof(ScoreParams, maybe_sinks) == 40);
  CHECK(offsetof(ScoreParams, variant) == 48);
  CHECK(sizeof(VariantParams) == 256);
  CHECK(sizeof(VariantTensor) == 56);
  CHECK(offsetof(VariantTensor, sizes) == 40);

  // A generated unit whose spec names it static_asserts this size and alignment.
  const detail::ParamsLayout& layout = detail::params_layout("kiln::ScoreParams");
  CHECK(layout.header == "kiln/params/score.h");
  CHECK(layout.size == sizeof(ScoreParams));
  CHECK(layout.alignment == alignof(ScoreParams));
}

TEST_CASE("every attention and decode kernel compiles against the host's score.h",
          "[params][score]") {
  const std::string host =
      read_file(std::filesystem::path(KILN_SOURCE_DIR) / "include" / "kiln" / "params" / "score.h");
  std::vector<KernelSpec> specs;
  for (const char* target : {"sm_80", "sm_90a", "gfx90a"}) {
    for (KernelSpec& spec : default_specs(target)) specs.push_back(std::move(spec));
  }
  const auto tree =
      detail::SourceTree::locate(std::filesystem::path(KILN_SOURCE_DIR) / "kernels_src");
  const std::set<std::string> holders = {"kiln::AttentionParams", "kiln::AttentionTmaParams",
                                         "kiln::DecodeParams"};
  std::set<std::string> seen;
  for (const KernelSpec& spec : specs) {
    if (!holders.contains(spec.params)) continue;  // unary, merge
    INFO(to_string(spec));
    const std::string unit = detail::render_source(spec, detail::params_layout(spec.params));
    int found = 0;
    for (const detail::Header& header : tree.closure(unit, spec.source)) {
      if (header.name != "kiln/params/score.h") continue;
      CHECK(header.content == host);
      ++found;
    }
    CHECK(found == 1);
    seen.insert(spec.params);
  }
  CHECK(seen == holders);
}

TEST_CASE("score_params fills the kernels' score from the options", "[params][score]") {
  const ScoreParams defaults = filled({});
  CHECK(defaults.softmax_scale == 0.125f);  // 1 / sqrt(64)
  CHECK(defaults.window_left == -1);
  CHECK(defaults.window_right == -1);
  CHECK(defaults.top_left == 0);
  CHECK(defaults.softcap == 0);
  CHECK(defaults.maybe_alibi_slopes == nullptr);
  CHECK(defaults.maybe_sinks == nullptr);
  CHECK_FALSE(detail::has_band({}));

  // causal is window_right 0 whatever window_right says, and keeps window_left.
  const ScoreOptions band{.softmax_scale = 0.5f,
                          .causal = true,
                          .window_left = 4095,
                          .window_right = 4095,
                          .top_left = true,
                          .softcap = 30};
  const ScoreParams p = filled(band);
  CHECK(p.softmax_scale == 0.5f);
  CHECK(p.window_left == 4095);
  CHECK(p.window_right == 0);
  CHECK(p.top_left == 1);
  CHECK(p.softcap == 30);
  CHECK(detail::has_band(band));
  CHECK(detail::has_band({.window_left = 0}));
  CHECK(detail::has_band({.window_right = 0}));

  // One slope per head, or per batch and head at the slopes' batch stride.
  TensorView slopes = TensorView::contiguous(reinterpret_cast<void*>(0x5000000), DType::f32, {8});
  const ScoreParams per_head = filled({.alibi_slopes = slopes});
  CHECK(per_head.maybe_alibi_slopes == slopes.data);
  CHECK(per_head.alibi_batch_stride == 0);
  slopes = TensorView::contiguous(slopes.data, DType::f32, {2, 8});
  slopes.strides[0] = 16;
  CHECK(filled({.alibi_slopes = slopes}).alibi_batch_stride == 16);

  // One sink per head.
  const TensorView sinks =
      TensorView::contiguous(reinterpret_cast<void*>(0x5100000), DType::f32, {8});
  CHECK(filled({.sinks = sinks}).maybe_sinks == sinks.data);
}

TEST_CASE("score_params carries a variant's scalars and tensors", "[params][score][variant]") {
  const Variant variant{.name = "v", .code = "struct kiln_variant {};"};
  ScoreOptions o{.variant = &variant};
  o.variant_scalars[0] = 1.5f;
  o.variant_scalars[7] = -2.f;
  TensorView ids = TensorView::contiguous(reinterpret_cast<void*>(0x5000000), DType::i32, {2, 64});
  ids.strides[0] = 80;
  o.variant_tensors = {ids,
                       TensorView::contiguous(reinterpret_cast<void*>(0x6000000), DType::f32, {8})};
  const ScoreParams p = filled(o);
  CHECK(p.variant.scalars[0] == 1.5f);
  CHECK(p.variant.scalars[7] == -2.f);
  CHECK(p.variant.tensors[0].data == ids.data);
  CHECK(p.variant.tensors[0].strides[0] == 80);
  CHECK(p.variant.tensors[0].strides[1] == 1);
  CHECK(p.variant.tensors[0].strides[2] == 0);
  CHECK(p.variant.tensors[1].strides[0] == 1);
  CHECK(p.variant.tensors[2].data == nullptr);
  CHECK(p.variant.tensors[0].sizes[0] == 2);
  CHECK(p.variant.tensors[0].sizes[1] == 64);
  CHECK(p.variant.tensors[0].sizes[2] == 1);
  CHECK(p.variant.tensors[1].sizes[0] == 8);
  CHECK(p.variant.tensors[3].sizes[3] == 1);

  CHECK_THROWS_WITH(filled({.variant_tensors = {ids}}),
                    Catch::Contains("variant_tensors holds 1 tensors but there is no variant"));
  const Variant empty{.name = "e"};
  CHECK_THROWS_WITH(filled({.variant = &empty}), Catch::Contains("variant 'e' has no code"));
  // The name is echoed without its control characters, which would reach the terminal.
  const Variant escape{.name = "e\x1b[2J"};
  CHECK_THROWS_WITH(filled({.variant = &escape}),
                    Catch::Contains("variant 'e\\x1b[2J' has no code"));
  o.variant_tensors.assign(5, ids);
  CHECK_THROWS_WITH(filled(o), Catch::Contains("variant_tensors holds 5 tensors: a variant takes "
                                               "at most 4"));
  o.variant_tensors = {TensorView::contiguous(reinterpret_cast<void*>(0x5000001), DType::f32, {8})};
  CHECK_THROWS_WITH(filled(o), Catch::Contains("variant_tensors[0]"));
  o.variant_tensors = {ids, TensorView::contiguous(ids.data, DType::f32, {4, 0})};
  CHECK_THROWS_WITH(filled(o), Catch::Contains("variant_tensors[1].size(1) is 0: a variant tensor "
                                               "holds 1 to 2147483647 elements along each "
                                               "dimension"));
}

TEST_CASE("variant_load clamps each index into its dimension", "[params][score][variant]") {
  // A 3 x 4 int32 tensor, rows 5 apart.
  std::vector<int> data(15);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<int>(i);
  const VariantTensor t{.data = data.data(), .strides = {5, 1, 0, 0}, .sizes = {3, 4, 1, 1}};
  CHECK(variant_load<int>(t, 1, 2) == 7);
  CHECK(variant_load<int>(t, 2, 3) == 13);
  CHECK(variant_load<int>(t, 3, 2) == 12);   // past the last row: the last
  CHECK(variant_load<int>(t, 1, 9) == 8);    // past the last column: the last
  CHECK(variant_load<int>(t, -1, -5) == 0);  // before the first: the first
  CHECK(variant_load<int>(t, 1, 2, 6, 7) == 7);
}

TEST_CASE("score_params refuses bad options, naming the value and the fix", "[params][score]") {
  CHECK_THROWS_WITH(filled({.softmax_scale = 0.f}),
                    Catch::Contains("softmax_scale is 0: it must be finite and positive"));
  CHECK_THROWS_WITH(filled({.softmax_scale = std::nanf("")}),
                    Catch::Contains("softmax_scale is nan"));
  CHECK_THROWS_WITH(filled({.softcap = -1}),
                    Catch::Contains("softcap is -1: use 0 (off) or a positive value"));
  CHECK_THROWS_WITH(filled({.causal = true, .window_right = -2}),
                    Catch::Contains("window (-1, -2) has a value below -1"));
  const TensorView wrong =
      TensorView::contiguous(reinterpret_cast<void*>(0x5000000), DType::f32, {3, 8});
  CHECK_THROWS_WITH(filled({.alibi_slopes = wrong}),
                    Catch::Contains("alibi_slopes.size(0) is 3") && Catch::Contains("batch"));
  CHECK_THROWS_WITH(filled({.sinks = wrong}), Catch::Contains("sinks has rank 2: use (heads)"));
}

}  // namespace kiln::test
