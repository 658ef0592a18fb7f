// The score model every attention family's Params hold (AttentionParams::score,
// DecodeParams::score): scale, band, softcap, ALiBi and sinks. Like every Params header, the host
// includes it and JIT compiles are handed it by this one name, "kiln/params/score.h", so Params
// headers that hold it include it the same way in both.
#pragma once

namespace kiln {

// Filled from ScoreOptions (kiln/score.hpp) by the host; kernels read it as is.
struct ScoreParams {
  float softmax_scale;  // multiplies q.k before softmax, usually 1/sqrt(head_dim)

  // The one mask model: query i attends key j when
  //   i + offset - window_left <= j <= i + offset + window_right,
  // with offset = seqlen_k - seqlen_q (bottom-right, FlashAttention's default) or 0 when
  // top_left is set. A window of -1 is unbounded; causal is (-1, 0). Only read by kernels whose
  // spec has band = true (the offset also places ALiBi).
  int window_left;
  int window_right;
  int top_left;  // 0 or 1

  // softcap > 0: logits become softcap * tanh(logits / softcap) (spec has_softcap).
  float softcap;

  // fp32 slopes: logit(i, j) -= slope * |i + offset - j|, slope at
  // maybe_alibi_slopes[b * alibi_batch_stride + h] (0 = one slope per head; spec has_alibi).
  const float* maybe_alibi_slopes;
  long long alibi_batch_stride;

  // fp32 attention sinks, one logit per query head at maybe_sinks[h] (null: none): each row's
  // softmax gains exp(sink) in its denominator and nothing in its output, and its LSE counts it,
  // as if a key of that logit and a zero value were attended (gpt-oss, StreamingLLM). The sink
  // is in the logits' units (after scale, softcap and ALiBi), and no mask removes it.
  const float* maybe_sinks;
};

}  // namespace kiln
