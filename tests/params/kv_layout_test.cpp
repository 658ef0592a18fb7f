// SPDX-License-Identifier: Apache-2.0
// include/kiln/params/kv_layout.h and lib/ops/kv_layout.cpp: the one KV layout every attention
// family holds, and the function that fills it from k and v.
#include <catch2/catch.hpp>

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "kiln/params/attention.h"
#include "kiln/params/decode.h"
#include "kiln/params/kv_layout.h"
#include "ops/kv_layout.hpp"

namespace kiln::test {
namespace {

// NOTE: kernels read these bytes as the host wrote them, so the layout is part of the ABI of
// every Params that holds it.
static_assert(std::is_standard_layout_v<KVLayout> && std::is_trivially_copyable_v<KVLayout>);
static_assert(std::same_as<decltype(AttentionParams::kv), KVLayout>);
static_assert(std::same_as<decltype(DecodeParams::kv), KVLayout>);

// A view at `data` of `shape` whose strides are `strides` (not contiguous, so each is seen).
TensorView strided(std::uintptr_t data, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> strides) {
  TensorView t = TensorView::contiguous(reinterpret_cast<void*>(data), DType::bf16, shape);
  std::copy(strides.begin(), strides.end(), t.strides.begin());
  return t;
}

}  // namespace

TEST_CASE("kv_layout takes k's and v's data and strides, and no batch stride from 3-d ones",
          "[params][kv_layout]") {
  const KVLayout batched =
      detail::kv_layout(strided(0x1000, {2, 300, 4, 64}, {160000, 512, 128, 1}),
                        strided(0x2000, {2, 300, 4, 32}, {80000, 256, 64, 1}));
  CHECK(batched.k == reinterpret_cast<void*>(0x1000));
  CHECK(batched.v == reinterpret_cast<void*>(0x2000));
  CHECK(batched.k_batch_stride == 160000);
  CHECK(batched.k_seq_stride == 512);
  CHECK(batched.k_head_stride == 128);
  CHECK(batched.v_batch_stride == 80000);
  CHECK(batched.v_seq_stride == 256);
  CHECK(batched.v_head_stride == 64);
  // How sequences find their keys is the family's to fill.
  CHECK(batched.maybe_batch_idx == nullptr);
  CHECK(batched.maybe_cu_seqlens_k == nullptr);
  CHECK(batched.maybe_block_table == nullptr);
  CHECK(batched.block_table_stride == 0);
  CHECK(batched.page_size == 0);

  const KVLayout varlen = detail::kv_layout(strided(0x1000, {600, 4, 64}, {512, 128, 1}),
                                            strided(0x2000, {600, 4, 32}, {136, 32, 1}));
  CHECK(varlen.k_batch_stride == 0);
  CHECK(varlen.k_seq_stride == 512);
  CHECK(varlen.k_head_stride == 128);
  CHECK(varlen.v_batch_stride == 0);
  CHECK(varlen.v_seq_stride == 136);
  CHECK(varlen.v_head_stride == 32);
}

}  // namespace kiln::test
