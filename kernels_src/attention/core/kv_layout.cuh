// SPDX-License-Identifier: Apache-2.0
// Where the K and V rows of a (sequence, kv head, key) lie in a KVLayout (kiln/params/kv_layout.h),
// for every attention kernel, prefill and decode: one mapping, whose paged form reads the block
// table once per tile that lies within one page.
#pragma once

#include "common/prelude.cuh"
#include "kiln/params/kv_layout.h"

namespace kiln::attention {

// How a kernel finds a sequence's keys in a KVLayout (kiln/params/kv_layout.h), as its spec
// fixes it.
enum class KVMode {
  batched,  // row b of the batch dim
  indexed,  // row maybe_batch_idx[b] of the batch dim (row b when null)
  varlen,   // tokens from maybe_cu_seqlens_k[b] of the token dim
  paged,    // pages through maybe_block_table
};

// A KV cache's mode (decode): paged, or one row per sequence through maybe_batch_idx; and that
// of k and v tensors (prefill): one row per sequence, or packed tokens.
__host__ __device__ constexpr KVMode cache_mode(bool paged) {
  return paged ? KVMode::paged : KVMode::indexed;
}
__host__ __device__ constexpr KVMode tensor_mode(bool varlen) {
  return varlen ? KVMode::varlen : KVMode::batched;
}

// The K and V rows of one (sequence, kv head). E is the element type, const to read.
template <KVMode Mode, class E>
struct KVRows {
  E* k;  // key 0 of the sequence (paged: row 0 of page 0), at the kv head
  E* v;
  long long k_seq_stride, v_seq_stride;
  long long k_page_stride, v_page_stride;
  const int* pages;  // the sequence's block-table row (paged)
  int page_size;

  // Element offsets from k and v of key `key`'s rows.
  __device__ __forceinline__ void offsets(int key, long long& k_off, long long& v_off) const {
    if constexpr (Mode == KVMode::paged) {
      const int index = key / page_size;
      at_page(pages[index], key - index * page_size, k_off, v_off);
    } else {
      k_off = key * k_seq_stride;
      v_off = key * v_seq_stride;
    }
  }

  __device__ __forceinline__ void at_page(long long page, long long row, long long& k_off,
                                          long long& v_off) const {
    k_off = page * k_page_stride + row * k_seq_stride;
    v_off = page * v_page_stride + row * v_seq_stride;
  }
};

// Element offsets in k and v.
struct KVOffsets {
  long long k;
  long long v;
};

// Which row of the batch dim (batched, indexed) or token (varlen) sequence `batch` starts at.
template <KVMode Mode>
__device__ __forceinline__ long long kv_sequence_index(const KVLayout& kv, int batch) {
  static_assert(Mode != KVMode::paged, "a paged sequence starts at no one row: see its pages.");
  if constexpr (Mode == KVMode::varlen) {
    return kv.maybe_cu_seqlens_k[batch];
  } else {
    return Mode == KVMode::indexed && kv.maybe_batch_idx != nullptr ? kv.maybe_batch_idx[batch]
                                                                    : batch;
  }
}

// Where key 0 of the sequence at `index` (kv_sequence_index) lies at kv head 0.
template <KVMode Mode>
__device__ __forceinline__ KVOffsets kv_index_start(const KVLayout& kv, long long index) {
  if constexpr (Mode == KVMode::varlen) {
    return {index * kv.k_seq_stride, index * kv.v_seq_stride};
  } else {
    return {index * kv.k_batch_stride, index * kv.v_batch_stride};
  }
}

// Where sequence `batch`'s key 0 lies at kv head 0 (paged: at 0; its pages come from the block
// table).
template <KVMode Mode>
__device__ __forceinline__ KVOffsets kv_sequence_start(const KVLayout& kv, int batch) {
  if constexpr (Mode == KVMode::paged) {
    return {0, 0};
  } else {
    return kv_index_start<Mode>(kv, kv_sequence_index<Mode>(kv, batch));
  }
}

// The rows of sequence `batch` at a kv head whose key 0 (paged: page 0's row 0) lies at `start`.
template <KVMode Mode, class E>
__device__ __forceinline__ KVRows<Mode, E> kv_rows_at(const KVLayout& kv, int batch,
                                                      KVOffsets start) {
  KVRows<Mode, E> r;
  r.pages = Mode == KVMode::paged ? kv.maybe_block_table + batch * kv.block_table_stride : nullptr;
  r.k = static_cast<E*>(kv.k) + start.k;
  r.v = static_cast<E*>(kv.v) + start.v;
  r.k_seq_stride = kv.k_seq_stride;
  r.v_seq_stride = kv.v_seq_stride;
  r.k_page_stride = kv.k_batch_stride;
  r.v_page_stride = kv.v_batch_stride;
  r.page_size = kv.page_size;
  return r;
}

template <KVMode Mode, class E>
__device__ __forceinline__ KVRows<Mode, E> kv_rows(const KVLayout& kv, int batch, int kv_head) {
  KVOffsets start{kv_head * kv.k_head_stride, kv_head * kv.v_head_stride};
  const KVOffsets sequence = kv_sequence_start<Mode>(kv, batch);
  start.k += sequence.k;
  start.v += sequence.v;
  return kv_rows_at<Mode, E>(kv, batch, start);
}

// Offsets of the keys of one tile: with a paged layout, one block-table read serves the tile
// when it lies within one page (page sizes that are multiples of the tile's keys), else one per
// key.
template <KVMode Mode, class E>
struct KVTileRows {
  const KVRows<Mode, E>& rows;
  int key0;
  // key0's row in its page, or -1: the tile crosses pages. Unless the layout is paged and the
  // tile crosses pages, the tile's rows follow k_seq_stride (v_seq_stride) apart from its first.
  int in_page;
  long long page;

  __device__ __forceinline__ KVTileRows(const KVRows<Mode, E>& r, int first_key, int keys)
      : rows(r), key0(first_key), in_page(-1), page(0) {
    if constexpr (Mode == KVMode::paged) {
      const int index = key0 / r.page_size;
      const int row = key0 - index * r.page_size;
      if (row + keys <= r.page_size) {
        in_page = row;
        page = r.pages[index];
      }
    }
  }

  __device__ __forceinline__ void offsets(int row, long long& k_off, long long& v_off) const {
    if (Mode == KVMode::paged && in_page >= 0) {
      rows.at_page(page, in_page + row, k_off, v_off);
    } else {
      rows.offsets(key0 + row, k_off, v_off);
    }
  }
};

// Where a sequence's keys start in the coordinates (column, token, head, batch) of a TMA
// descriptor of k or v (kiln::AttentionTmaParams): token and batch; varlen puts every sequence
// in the token dim of batch 0.
struct KVTmaCoords {
  int token0;  // key 0's
  int batch;
};

template <KVMode Mode>
__device__ __forceinline__ KVTmaCoords kv_tma_coords(const KVLayout& kv, int batch) {
  static_assert(Mode == KVMode::batched || Mode == KVMode::varlen,
                "a TMA descriptor tiles batched or varlen k and v only.");
  if constexpr (Mode == KVMode::varlen) {
    return {kv.maybe_cu_seqlens_k[batch], 0};
  } else {
    return {0, batch};
  }
}

// The descales of sequence b's kv head h in an fp8 K/V's KVDescales: pointers to them, each null
// where none is given.
struct HeadDescales {
  const float* k;
  const float* v;
};

__device__ __forceinline__ HeadDescales head_descales(const KVDescales& d, int b, int h) {
  return {d.maybe_k != nullptr ? d.maybe_k + b * d.k_batch_stride + h * d.k_head_stride : nullptr,
          d.maybe_v != nullptr ? d.maybe_v + b * d.v_batch_stride + h * d.v_head_stride : nullptr};
}

// The descale at `d`, or 1 where there is none (null).
__device__ __forceinline__ float descale_or_one(const float* d) {
  return d != nullptr ? *d : 1.f;
}

}  // namespace kiln::attention
