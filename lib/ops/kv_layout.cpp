// SPDX-License-Identifier: Apache-2.0
// The KV layout on the host.
#include "ops/kv_layout.hpp"

#include <utility>

#include <fmt/format.h>

#include "kiln/error.hpp"

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

void check_descales(const DescaleTensors& d, DType kv, std::string_view fp8_kv,
                    std::string_view holder, Extent batch, Extent heads_kv, int device) {
  for (const auto& [t, name] : {std::pair{&d.k, d.k_name}, std::pair{&d.v, d.v_name}}) {
    if (!*t) continue;
    if (!is_fp8(kv)) {
      invalid(fmt::format("{} is for {}, but {} has dtype {}: drop {}", name, fp8_kv, holder,
                          to_string(kv), name));
    }
    check_common(**t, name, device);
    require_rank(**t, name, 2, "(batch, heads_kv) fp32 descales");
    if ((*t)->dtype != DType::f32) {
      invalid(fmt::format("{} has dtype {}: it must be float32", name, to_string((*t)->dtype)));
    }
    require_size(**t, name, 0, batch.size, batch.what);
    require_size(**t, name, 1, heads_kv.size, heads_kv.what);
  }
}

KVDescales kv_descales(const DescaleTensors& d) {
  KVDescales descales{};
  if (d.k) {
    descales.maybe_k = static_cast<const float*>(d.k->data);
    descales.k_batch_stride = d.k->stride(0);
    descales.k_head_stride = d.k->stride(1);
  }
  if (d.v) {
    descales.maybe_v = static_cast<const float*>(d.v->data);
    descales.v_batch_stride = d.v->stride(0);
    descales.v_head_stride = d.v->stride(1);
  }
  return descales;
}

}  // namespace kiln::detail
