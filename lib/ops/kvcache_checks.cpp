// SPDX-License-Identifier: Apache-2.0
// KILN_DEBUG's host-side checks of a KV cache's index tensors.
#include "ops/kvcache_checks.hpp"

#include <vector>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "core/config.hpp"
#include "ops/tensor_checks.hpp"
#include "runtime/device_calls.hpp"

namespace kiln::detail {
namespace {

// Why a check ran and what it caught, for the end of its message.
std::string why_checked() {
  return fmt::format(
      " (checked because {} is on; without it the kernel would read or write out of bounds)",
      knob_name(Knob::debug));
}

// A copy of the `count` int32 values from the start of `t` (validated device memory).
std::vector<std::int32_t> host_copy(Runtime& runtime, const TensorView& t, std::int64_t count,
                                    void* stream) {
  std::vector<std::int32_t> values(static_cast<std::size_t>(count));
  detail::copy_to_host(runtime, values.data(), t.data, values.size() * sizeof(std::int32_t),
                       stream);
  return values;
}

void check_pages(const CacheIndices& host, const CacheBounds& bounds, std::size_t b,
                 std::int64_t keys) {
  const std::int64_t used = ceil_div(keys, bounds.page_size);
  for (std::int64_t p = 0; p < used; ++p) {
    const std::int32_t page =
        host.block_table[b * static_cast<std::size_t>(host.block_table_stride) +
                         static_cast<std::size_t>(p)];
    if (page < 0 || page >= bounds.pages) {
      invalid(fmt::format(
          "cache.block_table[{}][{}] is {}: page indices must be in [0, {}) (cache.k.size(0), "
          "the number of pages); sequence {} holds {} keys in {} pages of {}{}",
          b, p, page, bounds.pages, b, keys, used, bounds.page_size, why_checked()));
    }
  }
}

}  // namespace

void check_cache_indices(const CacheIndices& host, const CacheBounds& bounds) {
  for (std::size_t b = 0; b < host.seqlens.size(); ++b) {
    const std::int64_t cached = host.seqlens[b];
    if (cached < 0) {
      invalid(fmt::format("cache.seqlens[{}] is {}: key counts cannot be negative{}", b, cached,
                          why_checked()));
    }
    const std::int64_t keys = cached + bounds.seqlen_new;
    if (keys > bounds.capacity) {
      invalid(fmt::format(
          "cache.seqlens[{}] + seqlen_new is {} + {} = {} but the cache holds at most {} keys "
          "per sequence: grow the cache or evict keys{}",
          b, cached, bounds.seqlen_new, keys, bounds.capacity, why_checked()));
    }
    if (!host.batch_idx.empty() && (host.batch_idx[b] < 0 || host.batch_idx[b] >= bounds.rows)) {
      invalid(fmt::format("cache.batch_idx[{}] is {}: cache rows are [0, {}) (cache.k.size(0)){}",
                          b, host.batch_idx[b], bounds.rows, why_checked()));
    }
    if (!host.block_table.empty()) check_pages(host, bounds, b, keys);
  }
}

void check_cache_indices(Runtime& runtime, const KVCache& cache, const CacheBounds& bounds,
                         void* stream) {
  const std::int64_t batch = cache.seqlens.size(0);
  const std::vector<std::int32_t> seqlens = host_copy(runtime, cache.seqlens, batch, stream);
  std::vector<std::int32_t> batch_idx, block_table;
  if (cache.batch_idx) batch_idx = host_copy(runtime, *cache.batch_idx, batch, stream);
  CacheIndices host{.seqlens = seqlens};
  if (cache.block_table && batch > 0) {
    const TensorView& table = *cache.block_table;
    block_table = host_copy(runtime, table, (batch - 1) * table.stride(0) + table.size(1), stream);
    host.block_table_stride = table.stride(0);
  }
  host.batch_idx = batch_idx;
  host.block_table = block_table;
  check_cache_indices(host, bounds);
}

}  // namespace kiln::detail
