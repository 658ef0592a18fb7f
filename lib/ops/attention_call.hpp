// SPDX-License-Identifier: Apache-2.0
// The forward's call checks and params, which the backward takes as they are: a backward call
// is checked as the forward call it differentiates (ops/attention.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "kernels/kernel.hpp"
#include "kiln/attention.hpp"
#include "kiln/params/attention.h"

namespace kiln::detail {

// The sizes of one call, read off the validated tensors, and its checked score.
struct AttentionShape {
  bool varlen = false;
  std::int64_t batch = 0, seqlen_q = 0, seqlen_k = 0, heads = 0, heads_kv = 0;
  std::int64_t head_dim = 0, head_dim_v = 0;
  std::int64_t tokens_q = 0;  // varlen: total query tokens
  OperandDTypes dtypes{};
  ScoreParams score{};  // the options' score, as the kernels read it
};

struct ValidatedAttention {
  AttentionShape shape;
  AttentionProblem problem;
};

// Checks a forward call, throwing kiln::Error naming the tensor, the values and the fix.
ValidatedAttention validate_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const AttentionOptions& options,
                                      int device);

// The forward kernels' params of a validated call.
AttentionParams attention_params(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& out, const AttentionOptions& options,
                                 const AttentionShape& shape);

// Whether TMA can tile these tensors: data to point at, no empty dim, and every stride but the
// last a nonzero multiple of 16 bytes below 2^40 (a broadcast input, stride 0, is not one).
bool tma_can_tile(std::initializer_list<const TensorView*> tensors);

// The TMA descriptor of a tensor laid out as q, k or v (`t`, with `dim` columns) for boxes of
// `columns` columns (64; 128 for the all-fp8 forward's) by `rows` rows: 4-d (columns, tokens,
// heads, batch), one batch of every token with varlen. The driver may refuse it (kiln::Error).
TensorMap tensor_map_of(const TensorView& t, std::int64_t dim, int rows, bool varlen,
                        Runtime& runtime, int columns = 64);

}  // namespace kiln::detail
