// SPDX-License-Identifier: Apache-2.0
// Prefill's logits: the score model (attention/core/logits.cuh) over a thread's rows of one
// sequence, with the call's bias and fp8 keys' descale.
#pragma once

#include "attention/core/kv_layout.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/traits.cuh"
#include "attention/prefill/sequence.cuh"
#include "kiln/params/attention.h"

namespace kiln::attention {

// Prefill's transform for a thread whose rows are row0, row0 + 8, ... of the sequence (one row:
// row0); a row past the sequence makes its variant state from the last.
template <class Spec, class Math, int Rows>
__device__ __forceinline__ LogitTransform<Spec, Math, Rows, 8> make_logit_transform(
    const AttentionParams& p, const Sequence& seq, const Band& band, int row0) {
  LogitTransform<Spec, Math, Rows, 8> f =
      make_score_transform<Spec, Math, Rows, 8>(p.score, seq.seqlen_q, seq.seqlen_k);
  // fp8 keys' descale joins the softmax scale (every prefill spec names its dtype_kv).
  if constexpr (is_fp8<typename Spec::dtype_kv>) {
    f.scale *= descale_or_one(head_descales(p.descales, seq.batch, seq.head_kv).k);
  }
  if constexpr (Spec::has_bias) {
    f.bias = static_cast<const typename Spec::dtype_q*>(p.maybe_bias) +
             seq.batch * p.bias_batch_stride + seq.head * p.bias_head_stride;
    f.bias_row_stride = p.bias_row_stride;
    f.bias_col_stride = p.bias_col_stride;
  }
  f.overhang = row0 + 8 * (Rows - 1) >= seq.seqlen_q;
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    const int query = min(row0 + 8 * r, seq.seqlen_q - 1);
    f.rows[r] =
        make_logit_row<Spec>(p.score, {seq.batch, seq.head, seq.head_kv, query, -1, band.offset});
    f.rows[r].at.query = row0 + 8 * r;
  }
  return f;
}

}  // namespace kiln::attention
