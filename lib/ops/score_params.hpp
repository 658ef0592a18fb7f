// The score's options as AttentionParams and DecodeParams both hold them: scale, band, softcap
// and ALiBi, from AttentionOptions or DecodeOptions (the same field names).
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln::detail {

// Whether the options mask with a band: causal or a window.
template <class Options>
bool has_band(const Options& o) {
  return o.causal || o.window_left >= 0 || o.window_right >= 0;
}

template <class Params, class Options>
void set_score_params(Params& p, const Options& o, std::int64_t head_dim) {
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
}

}  // namespace kiln::detail
