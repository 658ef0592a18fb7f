// SPDX-License-Identifier: Apache-2.0
// Decode's GQA packing: the seqlen_q * (heads / heads_kv) query rows that share a kv head are
// numbered as one run of packed rows, so that each K/V tile feeds all of them. The decode kernel
// (attention.cuh) and the probe of its logits (tests/ops/kernels/probe/logits.cuh) map rows here.
#pragma once

#include "common/prelude.cuh"

namespace kiln {
namespace decode {

// A packed row's query token and query head.
struct PackedRow {
  int query;
  int head;
};

// The packed rows of one kv head: row r is query token r / group of head kv_head * group +
// r % group.
struct PackedRows {
  int kv_head;
  int group;  // query heads per kv head
  int count;  // seqlen_q * group

  __device__ __forceinline__ int first_head() const { return kv_head * group; }

  // Row r, of [0, count).
  __device__ __forceinline__ PackedRow at(int r) const {
    return {r / group, first_head() + r % group};
  }
  // Row r, or past the last row the last one: a block's rows past the end compute as it and are
  // never stored.
  __device__ __forceinline__ PackedRow at_or_last(int r) const { return at(min(r, count - 1)); }
};

}  // namespace decode
}  // namespace kiln
