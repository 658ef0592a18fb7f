// SPDX-License-Identifier: Apache-2.0
// The score model on the host: validation of ScoreOptions and the ScoreParams it fills.
#include "ops/score.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/user_text.hpp"
#include "ops/tensor_checks.hpp"

namespace kiln::detail {
namespace {

void check_scalars(const ScoreOptions& o) {
  // NOTE: the kernels fold the scale into the softmax's base-2 exponent, where a zero or
  // negative factor would turn masked -inf logits into NaN and invert the running max.
  if (o.softmax_scale && !(std::isfinite(*o.softmax_scale) && *o.softmax_scale > 0)) {
    invalid(fmt::format("softmax_scale is {}: it must be finite and positive", *o.softmax_scale));
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0) {
    invalid(fmt::format("softcap is {}: use 0 (off) or a positive value", o.softcap));
  }
  // NOTE: with causal, window_right is taken as 0 whatever it is, but a value below -1 is a
  // mistake either way.
  if (o.window_left < -1 || o.window_right < -1) {
    invalid(
        fmt::format("window ({}, {}) has a value below -1: windows are -1 (unbounded) or "
                    "a key count",
                    o.window_left, o.window_right));
  }
}

// fp32 ALiBi slopes, (heads) or (batch, heads).
void check_alibi_slopes(const TensorView& a, std::int64_t batch, std::int64_t heads, int device) {
  check_common(a, "alibi_slopes", device);
  if (a.dtype != DType::f32) {
    invalid(fmt::format("alibi_slopes has dtype {}: it must be f32", to_string(a.dtype)));
  }
  if (a.rank != 1 && a.rank != 2) {
    invalid(fmt::format("alibi_slopes has rank {}: use (heads) or (batch, heads)", a.rank));
  }
  require_size(a, "alibi_slopes", a.rank - 1, heads, "heads");
  if (a.rank == 2) require_size(a, "alibi_slopes", 0, batch, "batch");
  if (heads > 1 && a.stride(a.rank - 1) != 1) {
    invalid(fmt::format("alibi_slopes.stride(-1) is {}: it must be 1", a.stride(a.rank - 1)));
  }
}

// fp32 sinks, (heads).
void check_sinks(const TensorView& a, std::int64_t heads, int device) {
  check_common(a, "sinks", device);
  if (a.dtype != DType::f32) {
    invalid(fmt::format("sinks has dtype {}: it must be f32", to_string(a.dtype)));
  }
  if (a.rank != 1) invalid(fmt::format("sinks has rank {}: use (heads)", a.rank));
  require_size(a, "sinks", 0, heads, "heads");
  if (heads > 1 && a.stride(0) != 1) {
    invalid(fmt::format("sinks.stride(-1) is {}: it must be 1", a.stride(0)));
  }
}

// A variant's inputs: its scalars, and up to 4 tensors on the call's device (rank 1 to
// TensorView::max_rank, which VariantTensor's strides hold).
VariantParams variant_params(const ScoreOptions& o, int device) {
  VariantParams v{};
  std::copy(o.variant_scalars.begin(), o.variant_scalars.end(), v.scalars);
  for (VariantTensor& t : v.tensors) std::fill(std::begin(t.sizes), std::end(t.sizes), 1);
  if (!o.variant) {
    if (!o.variant_tensors.empty()) {
      invalid(
          fmt::format("variant_tensors holds {} tensors but there is no variant: set "
                      "ScoreOptions::variant, or leave variant_tensors empty",
                      o.variant_tensors.size()));
    }
    return v;
  }
  if (o.variant->code.empty()) {
    invalid(
        fmt::format("variant '{}' has no code: give it the kiln_variant struct its hook "
                    "lives in (kiln/variant.hpp)",
                    printable(o.variant->name)));
  }
  constexpr std::size_t kTensors = std::size(VariantParams{}.tensors);
  static_assert(TensorView::max_rank <= std::size(VariantTensor{}.strides));
  if (o.variant_tensors.size() > kTensors) {
    invalid(fmt::format("variant_tensors holds {} tensors: a variant takes at most {}",
                        o.variant_tensors.size(), kTensors));
  }
  for (std::size_t i = 0; i < o.variant_tensors.size(); ++i) {
    const TensorView& t = o.variant_tensors[i];
    const std::string name = fmt::format("variant_tensors[{}]", i);
    check_common(t, name, device);
    v.tensors[i].data = t.data;
    for (int d = 0; d < t.rank; ++d) {
      // variant_load clamps each index into [0, size - 1] as an int.
      if (t.size(d) < 1 || t.size(d) > std::numeric_limits<int>::max()) {
        invalid(
            fmt::format("{}.size({}) is {}: a variant tensor holds 1 to {} elements along "
                        "each dimension",
                        name, d, t.size(d), std::numeric_limits<int>::max()));
      }
      v.tensors[i].sizes[d] = static_cast<int>(t.size(d));
      v.tensors[i].strides[d] = t.stride(d);
    }
  }
  return v;
}

}  // namespace

bool has_band(const ScoreOptions& o) {
  return o.causal || o.window_left >= 0 || o.window_right >= 0;
}

ScoreParams score_params(const ScoreOptions& o, std::int64_t batch, std::int64_t heads,
                         std::int64_t head_dim, int device) {
  check_scalars(o);
  if (o.alibi_slopes) check_alibi_slopes(*o.alibi_slopes, batch, heads, device);
  if (o.sinks) check_sinks(*o.sinks, heads, device);
  ScoreParams p{};
  p.softmax_scale = o.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
  // NOTE: causal is window_right 0 whatever window_right says, and keeps window_left, as
  // FlashAttention takes it (flash_api.cpp: `if (is_causal) window_size_right = 0`): Hugging
  // Face transformers passes causal with (w - 1, w - 1) for its sliding-window layers.
  p.window_left = o.window_left;
  p.window_right = o.causal ? 0 : o.window_right;
  p.top_left = o.top_left ? 1 : 0;
  p.softcap = o.softcap;
  if (o.alibi_slopes) {
    p.maybe_alibi_slopes = static_cast<const float*>(o.alibi_slopes->data);
    p.alibi_batch_stride = o.alibi_slopes->rank == 2 ? o.alibi_slopes->stride(0) : 0;
  }
  if (o.sinks) p.maybe_sinks = static_cast<const float*>(o.sinks->data);
  p.variant = variant_params(o, device);
  return p;
}

}  // namespace kiln::detail
