// SPDX-License-Identifier: Apache-2.0
// kiln::ScoreOptions: how every attention family (attention(), attention_with_kvcache()) turns
// q.k into the logits its softmax sees: scale, band mask, softcap, ALiBi and sinks.
#pragma once

#include <array>
#include <optional>
#include <vector>

#include "kiln/tensor.hpp"
#include "kiln/variant.hpp"

namespace kiln {

struct ScoreOptions {
  std::optional<float> softmax_scale;  // default 1 / sqrt(head_dim)

  // One mask model, a band: query i sees key j when
  //   i + offset - window_left <= j <= i + offset + window_right
  // where offset = seqlen_k - seqlen_q (bottom-right, as FlashAttention) or 0 with top_left
  // (as mem-efficient attention's CausalFromTopLeft). -1 is unbounded. causal sets
  // window_right to 0 whatever it was (-1, 0 or a count) and keeps window_left, as
  // FlashAttention does: {.causal = true, .window_left = w - 1, .window_right = w - 1}, what
  // Hugging Face passes for a sliding-window layer, is the causal band of the last w keys.
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  bool top_left = false;

  float softcap = 0;  // > 0: logits = softcap * tanh(logits / softcap)

  // fp32 ALiBi slopes, (heads) or (batch, heads): logits -= slope * |i + offset - j|.
  std::optional<TensorView> alibi_slopes;

  // fp32 attention sinks, (heads): one learned logit per query head that joins each row's
  // softmax denominator with no value (gpt-oss, StreamingLLM), so out = sum_j exp(l_j) v_j /
  // (exp(sink) + sum_j exp(l_j)) and lse = log(exp(sink) + sum_j exp(l_j)). It is in the
  // logits' units (after the scale, softcap and ALiBi), no mask removes it, and a row that sees
  // no key gets out 0 and lse = sink. -inf is no sink for that head; NaN makes every row of the
  // head NaN, out and lse, as in the reference softmax it joins.
  std::optional<TensorView> sinks;

  // A user variant (kiln/variant.hpp), which the caller keeps alive for the call; null: none.
  // Its runtime inputs: 8 scalars and up to 4 tensors of any dtype and strides (rank 1 to 4),
  // on the call's device, read by the variant's code as it chooses.
  const Variant* variant = nullptr;
  std::array<float, 8> variant_scalars{};
  std::vector<TensorView> variant_tensors;
};

}  // namespace kiln
