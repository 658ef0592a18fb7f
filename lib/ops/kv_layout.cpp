// SPDX-License-Identifier: Apache-2.0
// The KV layout on the host.
#include "ops/kv_layout.hpp"

namespace kiln::detail {

void token_strides(const TensorView& t, long long& batch, long long& seq, long long& head) {
  batch = t.rank == 4 ? t.stride(0) : 0;
  seq = t.stride(t.rank - 3);
  head = t.stride(t.rank - 2);
}

KVLayout kv_layout(const TensorView& k, const TensorView& v) {
  KVLayout kv{};
  kv.k = k.data;
  kv.v = v.data;
  token_strides(k, kv.k_batch_stride, kv.k_seq_stride, kv.k_head_stride);
  token_strides(v, kv.v_batch_stride, kv.v_seq_stride, kv.v_head_stride);
  return kv;
}

}  // namespace kiln::detail
