// SPDX-License-Identifier: Apache-2.0
// KILN_DEBUG's checks of a KV cache's index tensors (seqlens, batch_idx, block_table): values
// the device reads without bounds checks, checked on the host against the cache's shape; and of
// fp8 K and V's descales (a cache's, or prefill's), which must be finite and positive.
#pragma once

#include <cstdint>
#include <span>

#include "kiln/decode.hpp"
#include "ops/kv_layout.hpp"

namespace kiln::detail {

// What a decode call's index values must stay within, from the validated shapes.
struct CacheBounds {
  std::int64_t capacity = 0;  // keys one sequence can hold: seqlen_cache, or max_pages * page_size
  std::int64_t seqlen_new = 0;  // keys appended to every sequence
  std::int64_t rows = 0;        // contiguous: cache rows batch_idx may name (cache.k.size(0))
  std::int64_t pages = 0;       // paged: pages block_table may name (cache.k.size(0))
  std::int64_t page_size = 0;   // paged: keys per page
};

// Host copies of the index tensors: seqlens (batch); batch_idx (batch) or empty; block_table
// (batch, max_pages) with rows block_table_stride apart, or empty.
struct CacheIndices {
  std::span<const std::int32_t> seqlens;
  std::span<const std::int32_t> batch_idx;
  std::span<const std::int32_t> block_table;
  std::int64_t block_table_stride = 0;
};

// Throws kiln::Error (invalid_argument) naming the sequence, the page, the value and its bound
// for the first index out of range: a negative seqlen, seqlens[b] + seqlen_new above the
// capacity, a batch_idx outside the cache rows, or a page index outside the pages among those
// sequence b uses (ceil((seqlens[b] + seqlen_new) / page_size)).
void check_cache_indices(const CacheIndices& host, const CacheBounds& bounds);

// Host copies of fp8 K and V's descales, (batch, heads_kv) each in row-major order, or empty,
// and how messages name them.
struct CacheDescales {
  std::span<const float> k;
  std::span<const float> v;
  std::int64_t heads_kv = 1;
  std::string_view k_name = "cache.k_descale";
  std::string_view v_name = "cache.v_descale";
};

// Throws kiln::Error (invalid_argument) naming the first descale that is not finite and
// positive: k_descale joins the softmax scale, where 0 or less empties or inverts the softmax.
void check_cache_descales(const CacheDescales& host);

// An fp8 cache's descales, as the messages name them.
DescaleTensors cache_descale_tensors(const KVCache& cache);

// Copies the descales `d` gives ((batch, heads_kv) fp32 of any strides, validated) to the host,
// synchronizing `stream`, and checks them (check_cache_descales).
void check_descale_values(Runtime& runtime, const DescaleTensors& d, void* stream);

// Copies the cache's index tensors and descales to the host (synchronizing `stream`) and checks
// them.
void check_cache_indices(Runtime& runtime, const KVCache& cache, const CacheBounds& bounds,
                         void* stream);

}  // namespace kiln::detail
