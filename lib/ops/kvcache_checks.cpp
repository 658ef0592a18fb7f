// SPDX-License-Identifier: Apache-2.0
// KILN_DEBUG's host-side checks of a KV cache's index tensors.
#include "ops/kvcache_checks.hpp"

#include <cmath>
#include <string_view>
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

// A copy of the `count` values of type T from the start of `t` (validated device memory).
template <class T = std::int32_t>
std::vector<T> host_copy(Runtime& runtime, const TensorView& t, std::int64_t count, void* stream) {
  std::vector<T> values(static_cast<std::size_t>(count));
  detail::copy_to_host(runtime, values.data(), t.data, values.size() * sizeof(T), stream);
  return values;
}

// A (batch, heads_kv) fp32 tensor of any non-negative strides, in row-major order.
std::vector<float> host_matrix(Runtime& runtime, const TensorView& t, void* stream) {
  const std::int64_t rows = t.size(0), cols = t.size(1);
  if (rows == 0 || cols == 0) return {};
  const std::vector<float> span =
      host_copy<float>(runtime, t, (rows - 1) * t.stride(0) + (cols - 1) * t.stride(1) + 1, stream);
  std::vector<float> values;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      values.push_back(span[static_cast<std::size_t>(r * t.stride(0) + c * t.stride(1))]);
    }
  }
  return values;
}

void check_descales(std::span<const float> values, std::int64_t heads_kv, std::string_view name) {
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i]) && values[i] > 0.f) continue;
    const auto heads = static_cast<std::size_t>(heads_kv);
    invalid(fmt::format("{}[{}][{}] is {}: descales must be finite and positive{}", name, i / heads,
                        i % heads, values[i], why_checked()));
  }
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

void check_cache_descales(const CacheDescales& host) {
  check_descales(host.k, host.heads_kv, host.k_name);
  check_descales(host.v, host.heads_kv, host.v_name);
}

DescaleTensors cache_descale_tensors(const KVCache& cache) {
  return {cache.k_descale, cache.v_descale, "cache.k_descale", "cache.v_descale"};
}

void check_descale_values(Runtime& runtime, const DescaleTensors& d, void* stream) {
  std::vector<float> k, v;
  if (d.k) k = host_matrix(runtime, *d.k, stream);
  if (d.v) v = host_matrix(runtime, *d.v, stream);
  const std::int64_t heads_kv = d.k ? d.k->size(1) : d.v ? d.v->size(1) : 1;
  check_cache_descales(
      {.k = k, .v = v, .heads_kv = heads_kv, .k_name = d.k_name, .v_name = d.v_name});
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
  check_descale_values(runtime, cache_descale_tensors(cache), stream);
}

}  // namespace kiln::detail
