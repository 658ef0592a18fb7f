// SPDX-License-Identifier: Apache-2.0
// The KV layout on the host: from the k and v tensors every attention family takes to the
// KVLayout its kernels read, and from an fp8 K/V's descales to their KVDescales.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/params/kv_layout.h"
#include "kiln/tensor.hpp"
#include "ops/tensor_checks.hpp"

namespace kiln::detail {

// k and v, checked by the caller, as the kernels read them: their data and strides, of (batch or
// page, seq, heads_kv, dim) tensors, or of (tokens, heads_kv, dim) ones with no batch stride
// (varlen). How sequences find their keys (maybe_batch_idx, maybe_cu_seqlens_k, the block table)
// is left unset, for the family to fill.
KVLayout kv_layout(const TensorView& k, const TensorView& v);

// The batch, seq and head strides of a 4-d (batch, seq, heads, dim) tensor, or the token and head
// strides of a 3-d (tokens, heads, dim) one, whose batch stride is 0.
void token_strides(const TensorView& t, long long& batch, long long& seq, long long& head);

// An fp8 K/V's descales as a call gives them, each optional, and the names messages give them:
// "k_descale", "cache.k_descale".
struct DescaleTensors {
  const std::optional<TensorView>& k;
  const std::optional<TensorView>& v;
  std::string_view k_name, v_name;
};

// Checks the descales given: only with an fp8 `kv` dtype (`fp8_kv` names that K/V in messages,
// "an fp8 cache", and `holder` the tensor whose dtype it is, "the cache"), fp32 of exactly
// (batch, heads_kv), any strides.
void check_descales(const DescaleTensors& d, DType kv, std::string_view fp8_kv,
                    std::string_view holder, Extent batch, Extent heads_kv, int device);

// The descales (checked) as the kernels read them: null where not given.
KVDescales kv_descales(const DescaleTensors& d);

}  // namespace kiln::detail
