// SPDX-License-Identifier: Apache-2.0
// The KV layout on the host: from the k and v tensors every attention family takes to the
// KVLayout its kernels read.
#pragma once

#include "kiln/params/kv_layout.h"
#include "kiln/tensor.hpp"

namespace kiln::detail {

// k and v, checked by the caller, as the kernels read them: their data and strides, of (batch or
// page, seq, heads_kv, dim) tensors, or of (tokens, heads_kv, dim) ones with no batch stride
// (varlen). How sequences find their keys (maybe_batch_idx, maybe_cu_seqlens_k, the block table)
// is left unset, for the family to fill.
KVLayout kv_layout(const TensorView& k, const TensorView& v);

// The batch, seq and head strides of a 4-d (batch, seq, heads, dim) tensor, or the token and head
// strides of a 3-d (tokens, heads, dim) one, whose batch stride is 0.
void token_strides(const TensorView& t, long long& batch, long long& seq, long long& head);

}  // namespace kiln::detail
