// SPDX-License-Identifier: Apache-2.0
// Decode attention over a KV cache and state merging: validate -> choose -> plan -> fit ->
// (debug checks) -> launch. The kernels' descriptions and tuning are in kernels/decode.cpp, the
// launch sequences in decode_kernels.cpp.
#include "kiln/decode.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "core/checked_math.hpp"
#include "kernels/decode.hpp"
#include "kiln/error.hpp"
#include "ops/decode_kernels.hpp"
#include "ops/kv_layout.hpp"
#include "ops/kvcache_checks.hpp"
#include "ops/score.hpp"
#include "ops/tensor_checks.hpp"
#include "runtime/device_calls.hpp"

namespace kiln {
namespace detail {
namespace {

constexpr std::int64_t kMaxGridYZ = 65535;
// How the operand dtype checks name the op.
constexpr std::string_view kOperation = "decode attention";

// The sizes of one decode call, read off the validated tensors, and its checked score.
struct Shape {
  std::int64_t batch = 0, seqlen_q = 0, heads = 0, heads_kv = 0;
  std::int64_t head_dim = 0, head_dim_v = 0;
  std::int64_t seqlen_new = 0;
  bool paged = false;
  std::int64_t cache_rows = 0;  // cache.k.size(0): cache rows, or pages when paged
  std::int64_t page_size = 0;   // paged: cache.k.size(1)
  std::int64_t capacity = 0;    // keys one sequence can hold
  bool token_descales = false;  // cache.k_token_descale and v_token_descale
  OperandDTypes dtypes{};
  ScoreParams score{};  // the options' score, as the kernels read it
};

std::string_view capacity_source(const Shape& s) {
  return s.paged ? "block_table.size(1) * page_size" : "cache.k.size(1) (seqlen_cache)";
}

// Both of a pair of optional tensors, or neither.
void require_pair(const std::optional<TensorView>& a, const std::optional<TensorView>& b,
                  std::string_view a_name, std::string_view b_name) {
  if (a.has_value() != b.has_value()) {
    invalid(
        fmt::format("{} and {} come together: {} is missing", a_name, b_name, a ? b_name : a_name));
  }
}

Shape check_q_cache_out(const TensorView& q, const KVCache& cache, const TensorView& out,
                        int device) {
  Shape s;
  s.paged = cache.block_table.has_value();
  require_rank(q, "q", 4, "(batch, seqlen_q, heads, head_dim)");
  require_rank(out, "out", 4, "(batch, seqlen_q, heads, head_dim_v)");
  require_rank(cache.k, "cache.k", 4,
               s.paged ? "(num_pages, page_size, heads_kv, head_dim)"
                       : "(batch_cache, seqlen_cache, heads_kv, head_dim)");
  require_rank(cache.v, "cache.v", 4,
               s.paged ? "(num_pages, page_size, heads_kv, head_dim_v)"
                       : "(batch_cache, seqlen_cache, heads_kv, head_dim_v)");
  for (const auto& [t, name] : {std::pair{&q, "q"}, std::pair{&cache.k, "cache.k"},
                                std::pair{&cache.v, "cache.v"}, std::pair{&out, "out"}}) {
    check_common(*t, name, device);
  }
  const NamedDType kv[] = {{"cache.k", cache.k.dtype}, {"cache.v", cache.v.dtype}};
  if (auto error = operand_dtypes_error(kOperation, decode_operand_dtypes(), {"q", q.dtype}, kv,
                                        {{"out", out.dtype}})) {
    throw *error;
  }
  s.dtypes = {.q = q.dtype, .kv = cache.k.dtype, .out = out.dtype};
  s.batch = q.size(0);
  s.seqlen_q = q.size(1);
  s.heads = q.size(2);
  s.head_dim = q.size(3);
  s.heads_kv = cache.k.size(2);
  s.head_dim_v = cache.v.size(3);
  s.cache_rows = cache.k.size(0);
  require_size(cache.v, "cache.v", 0, s.cache_rows, "cache.k.size(0)");
  require_size(cache.v, "cache.v", 1, cache.k.size(1), "cache.k.size(1)");
  require_size(cache.v, "cache.v", 2, s.heads_kv, "cache.k.size(2) (heads_kv)");
  require_size(cache.k, "cache.k", 3, s.head_dim, "q.size(-1) (head_dim)");
  require_size(out, "out", 0, s.batch, "q.size(0) (batch)");
  require_size(out, "out", 1, s.seqlen_q, "q.size(1) (seqlen_q)");
  require_size(out, "out", 2, s.heads, "q.size(2) (heads)");
  require_size(out, "out", 3, s.head_dim_v, "cache.v.size(-1) (head_dim_v)");
  check_heads(s.heads, s.heads_kv, "cache.k");
  check_head_dim(s.head_dim, "head_dim (q.size(-1))");
  check_head_dim(s.head_dim_v, "head_dim_v (cache.v.size(-1))");
  check_tile_tensors({{&q, "q"}, {&cache.k, "cache.k"}, {&cache.v, "cache.v"}, {&out, "out"}});
  require_no_overlap(out, "out");
  if (s.batch > kMaxGridYZ || s.heads_kv > kMaxGridYZ) {
    unsupported(fmt::format("batch {} and {} kv heads: the launch grid allows at most {} of each",
                            s.batch, s.heads_kv, kMaxGridYZ));
  }
  return s;
}

// seqlens, batch_idx and block_table; sets the cache's capacity.
void check_cache_tensors(const KVCache& cache, Shape& s, int device) {
  check_common(cache.seqlens, "cache.seqlens", device);
  check_int_vector(cache.seqlens, "cache.seqlens", s.batch, "q.size(0) (batch)");
  if (cache.batch_idx) {
    if (s.paged) {
      invalid(
          "cache.batch_idx is for contiguous caches; a paged cache maps each sequence to its "
          "pages through cache.block_table: drop batch_idx");
    }
    check_common(*cache.batch_idx, "cache.batch_idx", device);
    check_int_vector(*cache.batch_idx, "cache.batch_idx", s.batch, "q.size(0) (batch)");
  } else if (!s.paged && s.cache_rows < s.batch) {
    invalid(fmt::format(
        "cache.k.size(0) is {} but q.size(0) (batch) is {}: without batch_idx sequence b uses "
        "cache row b; pass batch_idx or a cache with a row per sequence",
        s.cache_rows, s.batch));
  }
  if (!s.paged) {
    s.capacity = cache.k.size(1);
    return;
  }
  const TensorView& table = *cache.block_table;
  check_common(table, "cache.block_table", device);
  require_rank(table, "cache.block_table", 2, "(batch, max_pages) int32 page indices");
  if (table.dtype != DType::i32) {
    invalid(
        fmt::format("cache.block_table has dtype {}: it must be int32", to_string(table.dtype)));
  }
  require_size(table, "cache.block_table", 0, s.batch, "q.size(0) (batch)");
  require_contiguous_last(table, "cache.block_table");
  s.page_size = cache.k.size(1);
  if (s.page_size < 1) {
    invalid("cache.k.size(1) (page_size) is 0: a page holds at least one key");
  }
  const std::optional<std::int64_t> capacity = checked_mul(table.size(1), s.page_size);
  require_int32(
      capacity,
      fmt::format("the paged cache's capacity, block_table.size(1) * page_size = {} * {},",
                  table.size(1), s.page_size));
  s.capacity = *capacity;
}

// An fp8 cache's descales per (token, kv head): fp32 shaped as the cache less its head dim.
void check_token_descales(const KVCache& cache, Shape& s, int device) {
  require_pair(cache.k_token_descale, cache.v_token_descale, "cache.k_token_descale",
               "cache.v_token_descale");
  if (!cache.k_token_descale) return;
  s.token_descales = true;
  const std::string_view layout = s.paged ? "(num_pages, page_size, heads_kv) fp32 descales"
                                          : "(batch_cache, seqlen_cache, heads_kv) fp32 descales";
  for (const auto& [t, name] : {std::pair{&*cache.k_token_descale, "cache.k_token_descale"},
                                std::pair{&*cache.v_token_descale, "cache.v_token_descale"}}) {
    if (!is_fp8(s.dtypes.kv)) {
      invalid(fmt::format("{} is for an fp8 cache, but the cache has dtype {}: drop {}", name,
                          to_string(s.dtypes.kv), name));
    }
    check_common(*t, name, device);
    require_rank(*t, name, 3, layout);
    if (t->dtype != DType::f32) {
      invalid(fmt::format("{} has dtype {}: it must be float32", name, to_string(t->dtype)));
    }
    require_size(*t, name, 0, s.cache_rows, "cache.k.size(0)");
    require_size(*t, name, 1, s.paged ? s.page_size : s.capacity, "cache.k.size(1)");
    require_size(*t, name, 2, s.heads_kv, "cache.k.size(2) (heads_kv)");
  }
}

void check_append(const DecodeOptions& o, const TensorView& q, Shape& s, int device) {
  require_pair(o.k_new, o.v_new, "k_new", "v_new");
  if (!o.k_new) return;
  const TensorView &k_new = *o.k_new, &v_new = *o.v_new;
  require_rank(k_new, "k_new", 4, "(batch, seqlen_new, heads_kv, head_dim)");
  require_rank(v_new, "v_new", 4, "(batch, seqlen_new, heads_kv, head_dim_v)");
  check_common(k_new, "k_new", device);
  check_common(v_new, "v_new", device);
  s.seqlen_new = k_new.size(1);
  for (const auto& [t, name] : {std::pair{&k_new, "k_new"}, std::pair{&v_new, "v_new"}}) {
    require_size(*t, name, 0, s.batch, "q.size(0) (batch)");
    require_size(*t, name, 2, s.heads_kv, "cache.k.size(2) (heads_kv)");
  }
  require_size(v_new, "v_new", 1, s.seqlen_new, "k_new.size(1) (seqlen_new)");
  require_size(k_new, "k_new", 3, s.head_dim, "q.size(-1) (head_dim)");
  require_size(v_new, "v_new", 3, s.head_dim_v, "cache.v.size(-1) (head_dim_v)");
  // An fp8 cache takes q's dtype, which the append quantizes by the descales; a 16-bit one its
  // own, which check_q_cache_out matched with q's.
  if (is_fp8(s.dtypes.kv)) {
    for (const auto& [t, name] : {std::pair{&k_new, "k_new"}, std::pair{&v_new, "v_new"}}) {
      if (t->dtype != q.dtype) {
        invalid(fmt::format(
            "{} has dtype {} with an {} cache: pass k_new and v_new in q's dtype ({}), which "
            "kiln quantizes into the cache (divided by the descales, saturating)",
            name, to_string(t->dtype), to_string(s.dtypes.kv), to_string(q.dtype)));
      }
    }
  } else {
    const NamedDType kv[] = {
        {"cache.k", s.dtypes.kv}, {"k_new", k_new.dtype}, {"v_new", v_new.dtype}};
    if (auto error = operand_dtypes_error(kOperation, decode_operand_dtypes(), {"q", q.dtype}, kv,
                                          std::nullopt)) {
      throw *error;
    }
  }
  check_tile_tensors({{&k_new, "k_new"}, {&v_new, "v_new"}});
  if (s.seqlen_new > s.capacity) {
    invalid(fmt::format(
        "k_new.size(1) (seqlen_new) is {} but the cache holds at most {} keys per sequence ({})",
        s.seqlen_new, s.capacity, capacity_source(s)));
  }
}

void check_rotary(const DecodeOptions& o, const TensorView& q, const Shape& s, int device) {
  require_pair(o.rotary_cos, o.rotary_sin, "rotary_cos", "rotary_sin");
  if (!o.rotary_cos) return;
  if (!o.k_new) {
    invalid(
        "rotary_cos and rotary_sin need k_new: the rotary embedding rotates the appended keys "
        "and q; pass k_new and v_new, or rotate q and the keys before caching them");
  }
  const TensorView &cos = *o.rotary_cos, &sin = *o.rotary_sin;
  for (const auto& [t, name] : {std::pair{&cos, "rotary_cos"}, std::pair{&sin, "rotary_sin"}}) {
    check_common(*t, name, device);
    require_rank(*t, name, 2, "(seqlen_ro, rotary_dim / 2)");
    if (t->dtype != q.dtype) {
      invalid(fmt::format("{} has dtype {} but q has dtype {}: they must match", name,
                          to_string(t->dtype), to_string(q.dtype)));
    }
    require_contiguous_last(*t, name);
    require_int32(t->size(0), fmt::format("{}.size(0)", name));
  }
  require_size(sin, "rotary_sin", 0, cos.size(0), "rotary_cos.size(0) (seqlen_ro)");
  require_size(sin, "rotary_sin", 1, cos.size(1), "rotary_cos.size(1) (rotary_dim / 2)");
  if (sin.size(0) > 1 && sin.stride(0) != cos.stride(0)) {
    invalid(fmt::format(
        "rotary_sin.stride(0) is {} but rotary_cos.stride(0) is {}: the tables share one row "
        "stride; make both contiguous",
        sin.stride(0), cos.stride(0)));
  }
  const std::int64_t rotary_dim = 2 * cos.size(1);
  if (rotary_dim < 2 || rotary_dim > s.head_dim) {
    invalid(fmt::format(
        "rotary_cos.size(1) is {}, so rotary_dim is {}: it must be from 2 to head_dim ({})",
        cos.size(1), rotary_dim, s.head_dim));
  }
  // NOTE: with a band, q token i rotates at seqlens[b] + i, which passes the last key when q
  // has more tokens than k_new.
  const std::int64_t past_keys =
      has_band(o.score) ? std::max<std::int64_t>(s.seqlen_q - s.seqlen_new, 0) : 0;
  if (cos.size(0) < s.capacity + past_keys) {
    invalid(fmt::format(
        "rotary_cos.size(0) (seqlen_ro) is {} but the cache holds up to {} keys per sequence "
        "({}){}: the tables need a row for every position",
        cos.size(0), s.capacity, capacity_source(s),
        past_keys ? fmt::format(" and with a band q's last {} tokens rotate past them", past_keys)
                  : ""));
  }
}

void check_options(const DecodeOptions& o, const TensorView& q, Shape& s, int device) {
  if (o.num_splits < 0 || o.num_splits > kMaxDecodeSplits) {
    invalid(fmt::format("num_splits is {}: use 0 (the heuristic chooses) or 1 to {}", o.num_splits,
                        kMaxDecodeSplits));
  }
  s.score = score_params(o.score, s.batch, s.heads, s.head_dim, device);
  if (o.lse) {
    check_lse(*o.lse, "lse", "(batch, heads, seqlen_q)",
              {{s.batch, "batch"}, {s.heads, "heads"}, {s.seqlen_q, "seqlen_q"}}, device);
    require_no_overlap(*o.lse, "lse");
  }
  check_append(o, q, s, device);
  check_rotary(o, q, s, device);
}

Shape validate(const TensorView& q, const KVCache& cache, const TensorView& out,
               const DecodeOptions& o, int device) {
  Shape s = check_q_cache_out(q, cache, out, device);
  check_cache_tensors(cache, s, device);
  detail::check_descales(detail::cache_descale_tensors(cache), s.dtypes.kv, "an fp8 cache",
                         "the cache", {s.batch, "q.size(0) (batch)"},
                         {s.heads_kv, "cache.k.size(2) (heads_kv)"}, device);
  check_token_descales(cache, s, device);
  check_options(o, q, s, device);
  if (o.k_new) {  // the append writes the cache, and its descales
    require_no_overlap(cache.k, "cache.k");
    require_no_overlap(cache.v, "cache.v");
    if (s.token_descales) {
      require_no_overlap(*cache.k_token_descale, "cache.k_token_descale");
      require_no_overlap(*cache.v_token_descale, "cache.v_token_descale");
      require_apart(*cache.k_token_descale, "cache.k_token_descale", *cache.v_token_descale,
                    "cache.v_token_descale");
    }
  }
  require_int32(s.seqlen_q * s.heads / std::max<std::int64_t>(s.heads_kv, 1),
                "seqlen_q * heads / heads_kv (query rows per kv head)");
  // NOTE: the launch sizes its scratch from this; q's sizes fit int32, so two of them fit int64.
  require_int32(checked_mul(s.batch * s.seqlen_q, s.heads),
                "batch * seqlen_q * heads (query rows)");
  return s;
}

DecodeProblem problem_of(const Shape& s, const DecodeOptions& o) {
  return {.dtype_q = s.dtypes.q,
          .dtype_kv = s.dtypes.kv,
          .dtype_out = s.dtypes.out,
          .head_dim = static_cast<int>(s.head_dim),
          .head_dim_v = static_cast<int>(s.head_dim_v),
          .rows_per_kv_head = static_cast<int>(s.seqlen_q * s.heads / s.heads_kv),
          .paged = s.paged,
          .band = has_band(o.score),
          .softcap = o.score.softcap > 0,
          .alibi = o.score.alibi_slopes.has_value(),
          // NOTE: with no keys to append and no q to rotate the append kernel has nothing to
          // do, and a grid of 0 blocks is a launch error.
          .append = o.k_new.has_value() && (s.seqlen_new > 0 || o.rotary_cos.has_value()),
          .rotary = o.rotary_cos.has_value(),
          .token_descales = s.token_descales,
          .variant = o.score.variant,
          .batch = static_cast<int>(s.batch),
          .heads_kv = static_cast<int>(s.heads_kv),
          .capacity = s.capacity,
          .requested_splits = o.num_splits};
}

// The first three strides of a (batch or page, seq, heads[, dim]) tensor.
void take_strides(const TensorView& t, long long& batch, long long& seq, long long& head) {
  batch = t.stride(0);
  seq = t.stride(1);
  head = t.stride(2);
}

DecodeParams params_of(const TensorView& q, const KVCache& cache, const TensorView& out,
                       const DecodeOptions& o, const Shape& s) {
  DecodeParams p{};
  p.q = q.data;
  p.out = out.data;
  p.kv = detail::kv_layout(cache.k, cache.v);
  take_strides(q, p.q_batch_stride, p.q_seq_stride, p.q_head_stride);
  take_strides(out, p.out_batch_stride, p.out_seq_stride, p.out_head_stride);
  p.seqlens = static_cast<const int*>(cache.seqlens.data);
  if (cache.batch_idx) p.kv.maybe_batch_idx = static_cast<const int*>(cache.batch_idx->data);
  if (cache.block_table) {
    p.kv.maybe_block_table = static_cast<const int*>(cache.block_table->data);
    p.kv.block_table_stride = cache.block_table->stride(0);
    p.kv.page_size = static_cast<int>(s.page_size);
  }
  p.batch = static_cast<int>(s.batch);
  p.heads = static_cast<int>(s.heads);
  p.heads_kv = static_cast<int>(s.heads_kv);
  p.seqlen_q = static_cast<int>(s.seqlen_q);
  p.seqlen_new = static_cast<int>(s.seqlen_new);
  p.score = s.score;
  if (o.lse) {
    p.maybe_lse = static_cast<float*>(o.lse->data);
    p.lse_batch_stride = o.lse->stride(0);
    p.lse_head_stride = o.lse->stride(1);
  }
  if (o.k_new) {
    p.maybe_k_new = o.k_new->data;
    p.maybe_v_new = o.v_new->data;
    take_strides(*o.k_new, p.k_new_batch_stride, p.k_new_seq_stride, p.k_new_head_stride);
    take_strides(*o.v_new, p.v_new_batch_stride, p.v_new_seq_stride, p.v_new_head_stride);
  }
  p.descales = detail::kv_descales(detail::cache_descale_tensors(cache));
  if (cache.k_token_descale) {
    // Laid out as the cache, less the head dim: kv's way to the rows, these strides.
    p.token_descale = p.kv;
    p.token_descale.k = cache.k_token_descale->data;
    p.token_descale.v = cache.v_token_descale->data;
    take_strides(*cache.k_token_descale, p.token_descale.k_batch_stride,
                 p.token_descale.k_seq_stride, p.token_descale.k_head_stride);
    take_strides(*cache.v_token_descale, p.token_descale.v_batch_stride,
                 p.token_descale.v_seq_stride, p.token_descale.v_head_stride);
  }
  if (o.rotary_cos) {
    p.maybe_rotary_cos = o.rotary_cos->data;
    p.maybe_rotary_sin = o.rotary_sin->data;
    p.rotary_stride = o.rotary_cos->stride(0);
    p.rotary_dim = static_cast<int>(2 * o.rotary_cos->size(1));
    p.rotary_interleaved = o.rotary_interleaved ? 1 : 0;
    p.rotary_q_causal = has_band(o.score) ? 1 : 0;
  }
  return p;
}

CacheBounds bounds_of(const Shape& s) {
  return {.capacity = s.capacity,
          .seqlen_new = s.seqlen_new,
          .rows = s.paged ? 0 : s.cache_rows,
          .pages = s.paged ? s.cache_rows : 0,
          .page_size = s.page_size};
}

// --- merge_states ---------------------------------------------------------------------------

// The sizes of a merge, read off the validated tensors.
struct MergeShape {
  std::int64_t tokens = 0, states = 1, heads = 0, head_dim = 0;
};

std::string_view states_layout(bool many) {
  return many ? "(tokens, states, heads, head_dim)" : "(tokens, heads, head_dim)";
}

// The sizes of the first state's v, which every other tensor of the merge must match.
MergeShape merge_shape(const TensorView& v, std::string_view name, bool many, int device) {
  require_rank(v, name, many ? 4 : 3, states_layout(many));
  check_common(v, name, device);
  MergeShape m;
  m.tokens = v.size(0);
  m.states = many ? v.size(1) : 1;
  m.heads = v.size(many ? 2 : 1);
  m.head_dim = v.size(many ? 3 : 2);
  if (m.states < 1) {
    invalid(fmt::format("{}.size(1) (states) is 0: merge at least one state", name));
  }
  check_head_dim(m.head_dim, fmt::format("head_dim ({}.size(-1))", name));
  for (int dim = 0; dim < v.rank; ++dim) {
    require_int32(v.size(dim), fmt::format("{}.size({})", name, dim));
  }
  return m;
}

// A state's v (many: with the states dim) of m's sizes, or the output's.
void check_states_v(const TensorView& v, std::string_view name, const MergeShape& m, bool many,
                    int device) {
  require_rank(v, name, many ? 4 : 3, states_layout(many));
  check_common(v, name, device);
  if (v.dtype != DType::f16 && v.dtype != DType::bf16 && v.dtype != DType::f32) {
    unsupported(fmt::format("{} has dtype {}: merge_states takes f16, bf16 or f32", name,
                            to_string(v.dtype)));
  }
  require_size(v, name, 0, m.tokens, "tokens");
  if (many) require_size(v, name, 1, m.states, "states");
  require_size(v, name, many ? 2 : 1, m.heads, "heads");
  require_size(v, name, many ? 3 : 2, m.head_dim, "head_dim");
  require_contiguous_last(v, name);
}

// A state's fp32 LSE s (many: with the states dim), or the output's.
void check_states_lse(const TensorView& s, std::string_view name, const MergeShape& m, bool many,
                      int device) {
  if (many) {
    check_lse(s, name, "(tokens, states, heads)",
              {{m.tokens, "tokens"}, {m.states, "states"}, {m.heads, "heads"}}, device);
  } else {
    check_lse(s, name, "(tokens, heads)", {{m.tokens, "tokens"}, {m.heads, "heads"}}, device);
  }
}

void check_merge_out(const TensorView& v_out, const TensorView* s_out, const MergeShape& m,
                     int device) {
  check_states_v(v_out, "v_out", m, false, device);
  require_no_overlap(v_out, "v_out");
  if (s_out) {
    check_states_lse(*s_out, "s_out", m, false, device);
    require_no_overlap(*s_out, "s_out");
  }
}

// One input of the merge kernel: v (tokens, [states,] heads, head_dim) and its s.
MergeSource source_of(const TensorView& v, const TensorView& s) {
  const bool many = v.rank == 4;
  MergeSource source{};
  source.v = v.data;
  source.lse = static_cast<const float*>(s.data);
  source.states = many ? static_cast<int>(v.size(1)) : 1;
  source.v_seq_stride = v.stride(0);
  source.v_state_stride = many ? v.stride(1) : 0;
  source.v_head_stride = v.stride(many ? 2 : 1);
  source.lse_seq_stride = s.stride(0);
  source.lse_state_stride = many ? s.stride(1) : 0;
  source.lse_head_stride = s.stride(many ? 2 : 1);
  return source;
}

// One input of a merge as the caller names it: v and s of one or many states.
struct States {
  const TensorView& v;
  const TensorView& s;
  std::string_view v_name, s_name;
};

// Validates `inputs` (many: with a states dim), v_out and s_out, and merges the states of each
// row of (batch 1, seqlen tokens, heads).
void merge(bool many, std::initializer_list<States> inputs, const TensorView& v_out,
           const TensorView* s_out, void* stream, Runtime& runtime) {
  const int device = runtime.device();
  const States& first = *inputs.begin();
  const MergeShape m = merge_shape(first.v, first.v_name, many, device);
  MergeParams p{};
  for (const States& in : inputs) {
    check_states_v(in.v, in.v_name, m, many, device);
    if (in.v.dtype != first.v.dtype) {
      invalid(fmt::format("{} has dtype {} but {} has dtype {}: the states must share one",
                          in.v_name, to_string(in.v.dtype), first.v_name,
                          to_string(first.v.dtype)));
    }
    check_states_lse(in.s, in.s_name, m, many, device);
    p.source[p.sources++] = source_of(in.v, in.s);
  }
  check_merge_out(v_out, s_out, m, device);
  if (m.tokens == 0 || m.heads == 0) return;  // nothing to write
  p.out = v_out.data;
  p.out_seq_stride = v_out.stride(0);
  p.out_head_stride = v_out.stride(1);
  if (s_out) {
    p.maybe_out_lse = static_cast<float*>(s_out->data);
    p.out_lse_seq_stride = s_out->stride(0);
    p.out_lse_head_stride = s_out->stride(1);
  }
  p.batch = 1;
  p.seqlen = static_cast<int>(m.tokens);
  p.heads = static_cast<int>(m.heads);
  const CallName call{"kiln::merge_states", many ? "kiln_merge_states_many" : "kiln_merge_states"};
  launch_merge(runtime, call, first.v.dtype, v_out.dtype, static_cast<int>(m.head_dim), p, stream);
}

constexpr CallName kCall{"kiln::attention_with_kvcache", "kiln_attention_with_kvcache"};

// Runs a call with `config`, or with choose()'s when there is none.
void run(const TensorView& q, const KVCache& cache, const TensorView& out,
         const DecodeOptions& options, const std::optional<DecodeConfig>& config, void* stream,
         Runtime& runtime) {
  const Shape s = validate(q, cache, out, options, runtime.device());
  if (s.batch == 0 || s.seqlen_q == 0 || s.heads == 0) return;  // nothing to write
  const Target target = target_to_run(runtime, kCall);
  require_target(target);
  const DecodeProblem problem = problem_of(s, options);
  require_cache_dtype(problem, target);
  if (config) check_config(*config);
  const DeviceInfo& device = require_gpu(runtime, kCall);  // choose() reads its SM count
  const DecodeConfig c = config ? *config : choose(problem, target, device.multiprocessors);
  const DecodePlan plan = decode_plan(problem, c);
  // Every kernel against the device before any is compiled or the append writes the cache: a
  // refused call does nothing.
  require_fits(plan, c, config ? nullptr : &target, device);
  if (detail::debug(runtime)) check_cache_indices(runtime, cache, bounds_of(s), stream);
  launch_decode(runtime, problem, c, plan, params_of(q, cache, out, options, s), stream);
}

}  // namespace
}  // namespace detail

void attention_with_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                            const DecodeOptions& options, void* stream, Runtime& runtime) {
  detail::run(q, cache, out, options, std::nullopt, stream, runtime);
}

void attention_with_kvcache(const TensorView& q, const KVCache& cache, const TensorView& out,
                            const DecodeOptions& options, const DecodeConfig& config, void* stream,
                            Runtime& runtime) {
  detail::run(q, cache, out, options, config, stream, runtime);
}

bool is_supported(const TensorView& q, const KVCache& cache, const TensorView& out,
                  const DecodeOptions& options, std::string* why, Runtime& runtime) {
  try {
    const detail::Shape s = detail::validate(q, cache, out, options, runtime.device());
    const Target target = runtime.target();
    detail::require_target(target);
    const DecodeProblem problem = detail::problem_of(s, options);
    detail::require_cache_dtype(problem, target);
    if (const DeviceInfo* device = detail::present_device(runtime)) {
      const DecodeConfig config = choose(problem, target, device->multiprocessors);
      const detail::DecodePlan plan = detail::decode_plan(problem, config);
      detail::require_fits(plan, config, &target, *device);
      detail::require_loadable(runtime, plan.attention.spec);
    }
    return true;
  } catch (const Error& e) {
    if (why) *why = e.what();
    return false;
  }
}

void merge_states(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                  const TensorView& s_b, const TensorView& v_out, const TensorView* s_out,
                  void* stream, Runtime& runtime) {
  detail::merge(false, {{v_a, s_a, "v_a", "s_a"}, {v_b, s_b, "v_b", "s_b"}}, v_out, s_out, stream,
                runtime);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView* s_out, void* stream, Runtime& runtime) {
  detail::merge(true, {{v, s, "v", "s"}}, v_out, s_out, stream, runtime);
}

}  // namespace kiln
