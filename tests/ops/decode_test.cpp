// SPDX-License-Identifier: Apache-2.0
// kiln::attention_with_kvcache() and merge_states() on a GPU against the fp64 CPU reference:
// contiguous and paged caches, ragged lengths, GQA, speculative queries, split-KV, cache_batch_idx,
// the append, rotary, masks, softcap, ALiBi, head dims, split hand-off over dirty scratch and on
// many streams, a CUDA graph replayed with new lengths, a miss under capture, and merging states,
// alone and end to end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/stream_zeros.hpp"
#include "decode_reference.hpp"
#include "gpu.hpp"
#include "gpu_harness.hpp"
#include "kiln/decode.hpp"
#include "runtime/device_calls.hpp"
#include "support.hpp"
#include "variant_twins.hpp"

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::test::Alibi;
using kiln::test::CacheMap;
using kiln::test::check_lse;
using kiln::test::check_out;
using kiln::test::DecodeInputs;
using kiln::test::DecodeReferenceProblem;
using kiln::test::DecodeReferenceResult;
using kiln::test::DeviceBuffer;
using kiln::test::kDTypes;
using kiln::test::Output;
using kiln::test::ReferenceResult;
using kiln::test::ScoreCase;
using kiln::test::Strided;
using kiln::test::upload;
using kiln::test::UserVariant;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::size_t at(std::int64_t i) {
  return static_cast<std::size_t>(i);
}

// ---------------------------------------------------------------------------------------------
// Host values to and from device memory.

std::vector<std::uint16_t> bits_of(DType dtype, const std::vector<double>& values) {
  std::vector<std::uint16_t> bits(values.size());
  std::transform(values.begin(), values.end(), bits.begin(),
                 [dtype](double x) { return kiln::test::to_bits(dtype, x); });
  return bits;
}

// fp8 values as their codes, a byte each.
std::vector<std::uint8_t> fp8_bytes(DType dtype, const std::vector<double>& values) {
  std::vector<std::uint8_t> bytes(values.size());
  std::transform(values.begin(), values.end(), bytes.begin(), [dtype](double x) {
    return static_cast<std::uint8_t>(kiln::test::to_bits(dtype, x));
  });
  return bytes;
}

// A device copy of `values` stored as `dtype` (f16, bf16 or f32).
std::unique_ptr<DeviceBuffer> upload_values(DType dtype, const std::vector<double>& values) {
  if (dtype == DType::f32) return upload(std::vector<float>(values.begin(), values.end()));
  return upload(bits_of(dtype, values));
}

// ---------------------------------------------------------------------------------------------
// One decode case: the inputs, the reference, the device call, every output checked.

enum class Rotary { none, neox, interleaved };

struct Case {
  DType dtype = DType::bf16;
  int heads = 8;
  int heads_kv = 2;
  int head_dim = 128;
  int head_dim_v = 0;  // 0: head_dim
  int seqlen_q = 1;
  std::vector<int> seqlens = {0, 1, 17, 300, 129};  // cached keys per sequence; batch = size
  int seqlen_new = 0;                               // appended keys per sequence
  double new_scale = 1;    // k_new and v_new's spread (past an fp8 cache's range: saturated)
  int page_size = 0;       // 0: a contiguous cache
  int capacity = 0;        // keys a sequence can hold; 0: its longest need plus 5
  bool batch_idx = false;  // contiguous: sequences in shuffled cache rows, among two spare rows
  ScoreCase score;
  Rotary rotary = Rotary::none;
  int rotary_dim = 0;  // 0: head_dim
  bool lse = true;
  int num_splits = 0;
  bool nan_slots = false;  // the slots no sequence reaches hold NaN instead of random values
  // An fp8 cache (e4m3 or e5m2) of random fp8 values, and with `descales` random k_descale and
  // v_descale (batch, heads_kv), by which the reference's keys and values are the cached ones.
  std::optional<DType> fp8;
  bool descales = false;
  // How the descales are laid out: (batch, heads_kv) contiguous, a transposed view of (heads_kv,
  // batch), or one value for all (strides 0).
  enum class Descales { contiguous, transposed, one } descale_layout = Descales::contiguous;
  // Descales per (slot, kv head) as well, random in [1/4, 2], laid out as the cache less its head
  // dim, or (with head_major) a view of (heads_kv, rows, row_len).
  bool token_descales = false;
  bool head_major = false;
  // A config of the test's instead of choose()'s, launched on the device.
  std::optional<kiln::DecodeConfig> config;

  int batch() const { return static_cast<int>(seqlens.size()); }
  int dim_v() const { return head_dim_v ? head_dim_v : head_dim; }
  int capacity_or_default() const {
    int longest = 0;
    for (int n : seqlens) longest = std::max(longest, n + seqlen_new);
    return capacity ? capacity : longest + 5;
  }
};

std::string describe(const Case& c) {
  std::ostringstream s;
  s << kiln::to_string(c.dtype) << " heads " << c.heads << "/" << c.heads_kv << " d " << c.head_dim
    << "/" << c.dim_v() << " seqlen_q " << c.seqlen_q << " seqlens";
  for (int n : c.seqlens) s << " " << n;
  if (c.seqlen_new) s << " append " << c.seqlen_new << " spread " << c.new_scale;
  s << " capacity " << c.capacity_or_default();
  if (c.page_size) s << " paged " << c.page_size;
  if (c.batch_idx) s << " batch_idx";
  s << kiln::test::describe(c.score);
  const char* rotaries[] = {"", " rotary", " rotary interleaved"};
  s << rotaries[static_cast<int>(c.rotary)];
  if (c.rotary != Rotary::none && c.rotary_dim) s << " " << c.rotary_dim;
  if (c.lse) s << " lse";
  s << " splits " << c.num_splits;
  if (c.nan_slots) s << " NaN in unused slots";
  if (c.fp8) s << " " << kiln::to_string(*c.fp8) << " cache" << (c.descales ? " descaled" : "");
  if (c.descales) s << " descale layout " << static_cast<int>(c.descale_layout);
  if (c.token_descales) s << " token descales" << (c.head_major ? " head-major" : "");
  if (c.config) {
    s << " config (splits " << c.config->num_splits << ", block_n " << c.config->block_n
      << ", warps " << c.config->warps << ", stages " << c.config->stages << ", m_tiles "
      << c.config->m_tiles << ")";
  }
  return s.str();
}

struct Setup {
  DecodeReferenceProblem problem;
  DecodeInputs inputs;
  // An fp8 cache's stored values, and its descales (batch, heads_kv): inputs.k_cache and
  // v_cache hold what each sequence attends, the stored values times its descales.
  std::vector<double> k_stored, v_stored, k_descale, v_descale;
  // With token descales, the cache's per (slot, kv head); else empty.
  std::vector<double> k_token, v_token;
  // The score options, and the device tensors they point to (ALiBi slopes, sinks, the variant's).
  kiln::ScoreOptions score;
  std::shared_ptr<std::vector<std::unique_ptr<DeviceBuffer>>> score_buffers =
      std::make_shared<std::vector<std::unique_ptr<DeviceBuffer>>>();
};

// Where the sequences' keys live: contiguous rows (shuffled with batch_idx), or pages handed
// out in a shuffled order, with three pages that no sequence owns.
CacheMap cache_map(const Case& c, std::mt19937& rng) {
  CacheMap m;
  const int batch = c.batch(), capacity = c.capacity_or_default();
  if (c.page_size == 0) {
    m.row_len = capacity;
    m.rows = batch + (c.batch_idx ? 2 : 0);
    if (c.batch_idx) {
      std::vector<int> rows(at(m.rows));
      std::iota(rows.begin(), rows.end(), 0);
      std::shuffle(rows.begin(), rows.end(), rng);
      m.batch_idx.assign(rows.begin(), rows.begin() + batch);
    }
    return m;
  }
  m.row_len = c.page_size;
  m.max_pages = (capacity + c.page_size - 1) / c.page_size;
  m.rows = batch * m.max_pages + 3;
  std::vector<int> pages(at(m.rows));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  m.block_table.assign(pages.begin(), pages.begin() + std::int64_t{batch} * m.max_pages);
  return m;
}

// cos and sin of the usual frequencies (base 10000) for every position the cache can hold
// (a paged cache: every page of the block table's row), as FlashAttention asks too.
void add_rotary(const Case& c, DecodeReferenceProblem& p) {
  p.rotary_dim = c.rotary_dim ? c.rotary_dim : c.head_dim;
  p.rotary_interleaved = c.rotary == Rotary::interleaved;
  const int positions = p.cache.paged() ? p.cache.max_pages * p.cache.row_len : p.cache.row_len;
  for (int position = 0; position < positions; ++position) {
    for (int i = 0; i < p.rotary_dim / 2; ++i) {
      const double theta = position * std::pow(10000.0, -2.0 * i / p.rotary_dim);
      p.rotary_cos.push_back(kiln::test::round_to(c.dtype, std::cos(theta)));
      p.rotary_sin.push_back(kiln::test::round_to(c.dtype, std::sin(theta)));
    }
  }
}

// Fresh random q and new tokens for the problem's lengths.
void randomize_queries(const Case& c, Setup& s, std::mt19937& rng) {
  const std::int64_t batch = c.batch();
  s.inputs.q =
      kiln::test::random_normal(c.dtype, at(batch * c.seqlen_q * c.heads * c.head_dim), rng);
  s.inputs.k_new.clear();
  s.inputs.v_new.clear();
  if (c.seqlen_new > 0) {
    const std::int64_t tokens = batch * c.seqlen_new * c.heads_kv;
    s.inputs.k_new = kiln::test::random_normal(c.dtype, at(tokens * c.head_dim), rng);
    s.inputs.v_new = kiln::test::random_normal(c.dtype, at(tokens * c.dim_v()), rng);
    for (std::vector<double>* values : {&s.inputs.k_new, &s.inputs.v_new}) {
      for (double& x : *values) x = kiln::test::round_to(c.dtype, x * c.new_scale);
    }
  }
}

// NaN in every slot no sequence reads or appends to: a key past a sequence's end must not leak
// into its output, not even through 0 * NaN.
void poison_unreached_slots(const Case& c, Setup& s) {
  const CacheMap& m = s.problem.cache;
  std::vector<bool> reached(at(m.slots()), false);
  for (int b = 0; b < c.batch(); ++b) {
    for (int j = 0; j < c.seqlens[at(b)] + c.seqlen_new; ++j) reached[at(m.slot(b, j))] = true;
  }
  const auto k_slot = at(c.heads_kv * c.head_dim), v_slot = at(c.heads_kv * c.dim_v());
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t slot = 0; slot < reached.size(); ++slot) {
    if (reached[slot]) continue;
    std::fill_n(&s.inputs.k_cache[slot * k_slot], k_slot, nan);
    std::fill_n(&s.inputs.v_cache[slot * v_slot], v_slot, nan);
    if (c.fp8) {  // the stored codes are what the device gets
      std::fill_n(&s.k_stored[slot * k_slot], k_slot, nan);
      std::fill_n(&s.v_stored[slot * v_slot], v_slot, nan);
    }
    if (c.token_descales) {  // read past a sequence's keys, NaN would reach the mma as 0 * NaN
      const auto heads = at(c.heads_kv);
      std::fill_n(&s.k_token[slot * heads], heads, nan);
      std::fill_n(&s.v_token[slot * heads], heads, nan);
    }
  }
}

// An fp8 cache: fresh random fp8 values stored, and what each sequence's kv head attends, the
// stored values times its descales (random in [1/4, 2], fp32; 1 without).
void quantize_cache(const Case& c, Setup& s, std::mt19937& rng) {
  const CacheMap& m = s.problem.cache;
  const auto slots = at(m.slots());
  s.k_stored = kiln::test::random_normal(*c.fp8, slots * at(c.heads_kv * c.head_dim), rng);
  s.v_stored = kiln::test::random_normal(*c.fp8, slots * at(c.heads_kv * c.dim_v()), rng);
  const auto scales = at(c.batch() * c.heads_kv);
  std::uniform_real_distribution<double> range(0.25, 2.0);
  s.k_descale.assign(scales, 1.0);
  s.v_descale.assign(scales, 1.0);
  if (c.descales) {
    for (double& x : s.k_descale) x = static_cast<float>(range(rng));
    for (double& x : s.v_descale) x = static_cast<float>(range(rng));
    if (c.descale_layout == Case::Descales::one) {
      s.k_descale.assign(scales, s.k_descale[0]);
      s.v_descale.assign(scales, s.v_descale[0]);
    }
  }
  if (c.token_descales) {
    for (std::vector<double>* token : {&s.k_token, &s.v_token}) {
      token->resize(slots * at(c.heads_kv));
      for (double& x : *token) x = static_cast<float>(range(rng));
    }
  }
  s.inputs.k_cache = s.k_stored;
  s.inputs.v_cache = s.v_stored;
  for (int b = 0; b < c.batch(); ++b) {
    for (int j = 0; j < c.seqlens[at(b)]; ++j) {
      const auto slot = at(m.slot(b, j));
      for (int h = 0; h < c.heads_kv; ++h) {
        const std::size_t scale = at(b * c.heads_kv + h);
        const std::size_t token = slot * at(c.heads_kv) + at(h);
        const double k_scale = s.k_descale[scale] * (c.token_descales ? s.k_token[token] : 1.0);
        const double v_scale = s.v_descale[scale] * (c.token_descales ? s.v_token[token] : 1.0);
        for (int e = 0; e < c.head_dim; ++e) {
          const std::size_t i = (slot * at(c.heads_kv) + at(h)) * at(c.head_dim) + at(e);
          s.inputs.k_cache[i] = s.k_stored[i] * k_scale;
        }
        for (int e = 0; e < c.dim_v(); ++e) {
          const std::size_t i = (slot * at(c.heads_kv) + at(h)) * at(c.dim_v()) + at(e);
          s.inputs.v_cache[i] = s.v_stored[i] * v_scale;
        }
      }
    }
  }
}

Setup make_setup(const Case& c, std::mt19937& rng) {
  Setup s;
  DecodeReferenceProblem& p = s.problem;
  kiln::test::ReferenceProblem& a = p.attention;
  a.dtype = c.dtype;
  a.heads = c.heads;
  a.heads_kv = c.heads_kv;
  a.head_dim = c.head_dim;
  a.head_dim_v = c.dim_v();
  kiln::test::set_reference_score(c.score, c.head_dim, a);
  s.score = kiln::test::score_options(c.score);
  kiln::test::add_score_tensors(c.score, c.batch(), c.heads, std::ranges::max(c.seqlens), a,
                                s.score, *s.score_buffers, rng);
  if (c.score.variant != UserVariant::none) {
    REQUIRE(c.score.alibi == Alibi::none);
    kiln::test::VariantShape shape{.batch = c.batch(), .heads = c.heads, .seqlen_q = c.seqlen_q};
    for (int n : c.seqlens) {
      const int keys = n + c.seqlen_new;
      shape.seqlen_k = std::max(shape.seqlen_k, keys);
      shape.offsets.push_back(c.score.top_left ? 0 : keys - c.seqlen_q);
    }
    kiln::test::add_user_variant(c.score.variant, shape, a, s.score, *s.score_buffers, rng);
  }
  p.cache = cache_map(c, rng);
  p.seqlens = c.seqlens;
  p.seqlen_q = c.seqlen_q;
  p.seqlen_new = c.seqlen_new;
  if (c.rotary != Rotary::none) add_rotary(c, p);

  const auto slots = at(p.cache.slots());
  s.inputs.k_cache = kiln::test::random_normal(c.dtype, slots * at(c.heads_kv * c.head_dim), rng);
  s.inputs.v_cache = kiln::test::random_normal(c.dtype, slots * at(c.heads_kv * c.dim_v()), rng);
  randomize_queries(c, s, rng);
  if (c.fp8) {
    quantize_cache(c, s, rng);
    p.cache_fp8 = c.fp8;
    p.k_descale = s.k_descale;
    p.v_descale = s.v_descale;
    p.k_token_descale = s.k_token;
    p.v_token_descale = s.v_token;
  }
  if (c.nan_slots) poison_unreached_slots(c, s);
  return s;
}

// Everything on the device for one case, and the views and options that point into it.
struct DeviceDecode {
  std::vector<std::unique_ptr<DeviceBuffer>> inputs;  // kept alive for the views
  std::unique_ptr<DeviceBuffer> k_cache, v_cache;
  std::unique_ptr<DeviceBuffer> k_token, v_token;  // token descales, in the case's layout
  std::unique_ptr<Output> out, lse;
  TensorView q, out_view;
  kiln::KVCache cache;
  kiln::DecodeOptions options;
  std::optional<kiln::DecodeConfig> config;

  void* keep(std::unique_ptr<DeviceBuffer> buffer) {
    inputs.push_back(std::move(buffer));
    return inputs.back()->get();
  }
};

void set_options(const Case& c, const Setup& s, DeviceDecode& d) {
  const DecodeReferenceProblem& p = s.problem;
  const std::int64_t batch = c.batch(), heads_kv = c.heads_kv;
  d.options.score = s.score;
  d.options.num_splits = c.num_splits;
  d.config = c.config;
  if (c.seqlen_new > 0) {
    d.options.k_new = TensorView::contiguous(
        d.keep(upload_values(c.dtype, s.inputs.k_new)), c.dtype,
        {batch, std::int64_t{c.seqlen_new}, heads_kv, std::int64_t{c.head_dim}});
    d.options.v_new = TensorView::contiguous(
        d.keep(upload_values(c.dtype, s.inputs.v_new)), c.dtype,
        {batch, std::int64_t{c.seqlen_new}, heads_kv, std::int64_t{c.dim_v()}});
  }
  if (p.rotary_dim > 0) {
    const std::int64_t half = p.rotary_dim / 2;
    const auto rows = static_cast<std::int64_t>(p.rotary_cos.size()) / half;
    d.options.rotary_cos =
        TensorView::contiguous(d.keep(upload_values(c.dtype, p.rotary_cos)), c.dtype, {rows, half});
    d.options.rotary_sin =
        TensorView::contiguous(d.keep(upload_values(c.dtype, p.rotary_sin)), c.dtype, {rows, half});
    d.options.rotary_interleaved = p.rotary_interleaved;
  }
  if (c.lse) d.options.lse = d.lse->view();
}

// A (batch, heads_kv) descale tensor holding `values` in c's layout.
TensorView descale_view(const Case& c, const std::vector<double>& values, DeviceDecode& d) {
  const std::int64_t batch = c.batch(), heads_kv = c.heads_kv;
  switch (c.descale_layout) {
    case Case::Descales::transposed: {
      std::vector<double> by_head(values.size());
      for (std::int64_t b = 0; b < batch; ++b) {
        for (std::int64_t h = 0; h < heads_kv; ++h)
          by_head[at(h * batch + b)] = values[at(b * heads_kv + h)];
      }
      TensorView t = TensorView::contiguous(d.keep(upload_values(DType::f32, by_head)), DType::f32,
                                            {batch, heads_kv});
      t.strides = {1, batch, 0, 0};
      return t;
    }
    case Case::Descales::one: {
      TensorView t = TensorView::contiguous(d.keep(upload_values(DType::f32, {values[0]})),
                                            DType::f32, {batch, heads_kv});
      t.strides = {0, 0, 0, 0};
      return t;
    }
    case Case::Descales::contiguous: break;
  }
  return TensorView::contiguous(d.keep(upload_values(DType::f32, values)), DType::f32,
                                {batch, heads_kv});
}

// Token descales (slot, kv head) in c's layout: as given, or head-major.
std::vector<double> token_layout(const Case& c, const CacheMap& m,
                                 const std::vector<double>& values) {
  if (!c.head_major) return values;
  const auto slots = at(m.slots()), heads = at(c.heads_kv);
  std::vector<double> by_head(values.size());
  for (std::size_t slot = 0; slot < slots; ++slot) {
    for (std::size_t h = 0; h < heads; ++h) by_head[h * slots + slot] = values[slot * heads + h];
  }
  return by_head;
}

// The (rows, row_len, heads_kv) view of token descales uploaded in c's layout.
TensorView token_view(const Case& c, const CacheMap& m, const DeviceBuffer& values) {
  const std::int64_t rows = m.rows, row_len = m.row_len, heads = c.heads_kv;
  TensorView t = TensorView::contiguous(values.get(), DType::f32, {rows, row_len, heads});
  if (c.head_major) t.strides = {row_len, 1, rows * row_len, 0};
  return t;
}

// Token descales (slot, kv head) from downloaded bits in c's layout.
std::vector<float> token_values(const Case& c, const CacheMap& m,
                                const std::vector<std::uint32_t>& bits) {
  std::vector<float> got(bits.size());
  std::memcpy(got.data(), bits.data(), bits.size() * sizeof(float));
  if (!c.head_major) return got;
  const auto slots = at(m.slots()), heads = at(c.heads_kv);
  std::vector<float> by_slot(got.size());
  for (std::size_t slot = 0; slot < slots; ++slot) {
    for (std::size_t h = 0; h < heads; ++h) by_slot[slot * heads + h] = got[h * slots + slot];
  }
  return by_slot;
}

DeviceDecode upload_case(const Case& c, const Setup& s) {
  const CacheMap& m = s.problem.cache;
  const std::int64_t batch = c.batch(), heads = c.heads, heads_kv = c.heads_kv;
  const std::int64_t seqlen_q = c.seqlen_q, dim = c.head_dim, dim_v = c.dim_v();
  DeviceDecode d;
  d.q = TensorView::contiguous(d.keep(upload_values(c.dtype, s.inputs.q)), c.dtype,
                               {batch, seqlen_q, heads, dim});
  const DType cache_dtype = c.fp8.value_or(c.dtype);
  if (c.fp8) {
    d.k_cache = upload(fp8_bytes(*c.fp8, s.k_stored));
    d.v_cache = upload(fp8_bytes(*c.fp8, s.v_stored));
    if (c.descales) {
      for (const auto& [view, values] : {std::pair{&d.cache.k_descale, &s.k_descale},
                                         std::pair{&d.cache.v_descale, &s.v_descale}}) {
        *view = descale_view(c, *values, d);
      }
    }
    if (c.token_descales) {
      d.k_token = upload_values(DType::f32, token_layout(c, m, s.k_token));
      d.v_token = upload_values(DType::f32, token_layout(c, m, s.v_token));
      d.cache.k_token_descale = token_view(c, m, *d.k_token);
      d.cache.v_token_descale = token_view(c, m, *d.v_token);
    }
  } else {
    d.k_cache = upload_values(c.dtype, s.inputs.k_cache);
    d.v_cache = upload_values(c.dtype, s.inputs.v_cache);
  }
  d.cache.k =
      TensorView::contiguous(d.k_cache->get(), cache_dtype,
                             {std::int64_t{m.rows}, std::int64_t{m.row_len}, heads_kv, dim});
  d.cache.v =
      TensorView::contiguous(d.v_cache->get(), cache_dtype,
                             {std::int64_t{m.rows}, std::int64_t{m.row_len}, heads_kv, dim_v});
  d.cache.seqlens = TensorView::contiguous(d.keep(upload(s.problem.seqlens)), DType::i32, {batch});
  if (!m.batch_idx.empty()) {
    d.cache.batch_idx = TensorView::contiguous(d.keep(upload(m.batch_idx)), DType::i32, {batch});
  }
  if (m.paged()) {
    d.cache.block_table = TensorView::contiguous(d.keep(upload(m.block_table)), DType::i32,
                                                 {batch, std::int64_t{m.max_pages}});
  }
  d.out = std::make_unique<Output>(c.dtype, Strided::dense({batch, seqlen_q, heads, dim_v}));
  d.out_view = d.out->view();
  d.lse = std::make_unique<Output>(DType::f32, Strided::dense({batch, heads, seqlen_q}));
  set_options(c, s, d);
  return d;
}

struct Downloaded {
  std::vector<std::uint8_t> out, lse;
  std::vector<std::uint16_t> k_cache, v_cache;
  // Token descales' bits (NaN compares equal to itself), as laid out on the device; empty: none.
  std::vector<std::uint32_t> k_token, v_token;
  bool operator==(const Downloaded&) const = default;
};

Downloaded download(const DeviceDecode& d) {
  Downloaded got{d.out->bytes(), d.lse->bytes(), d.k_cache->download<std::uint16_t>(),
                 d.v_cache->download<std::uint16_t>()};
  if (d.k_token) {
    got.k_token = d.k_token->download<std::uint32_t>();
    got.v_token = d.v_token->download<std::uint32_t>();
  }
  return got;
}

// One call with out and lse poisoned first.
Downloaded run(kiln::Runtime& rt, DeviceDecode& d) {
  d.out->poison();
  d.lse->poison();
  if (d.config) {
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, *d.config, nullptr, rt);
  } else {
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, nullptr, rt);
  }
  kiln::test::sync_and_check();
  return download(d);
}

// An fp8 cache's stored values after the call: as uploaded, but in the appended slots the
// reference's over their descales (exactly the stored values: the reference attends them times
// the descale, times the token descale when there is one, in fp32).
std::vector<double> stored_after(const Case& c, const Setup& s, const std::vector<double>& stored,
                                 const std::vector<double>& after,
                                 const std::vector<double>& descales,
                                 const std::vector<double>& token_descales, int dim) {
  std::vector<double> values = stored;
  for (int b = 0; b < c.batch(); ++b) {
    for (int t = 0; t < c.seqlen_new; ++t) {
      const auto slot = at(s.problem.cache.slot(b, c.seqlens[at(b)] + t));
      for (int h = 0; h < c.heads_kv; ++h) {
        const auto head = static_cast<float>(descales[at(b * c.heads_kv + h)]);
        const double descale =
            token_descales.empty()
                ? head
                : head * static_cast<float>(token_descales[slot * at(c.heads_kv) + at(h)]);
        for (int e = 0; e < dim; ++e) {
          const std::size_t i = (slot * at(c.heads_kv) + at(h)) * at(dim) + at(e);
          values[i] = after[i] / descale;
        }
      }
    }
  }
  return values;
}

// The stored codes of a downloaded cache, one per element: 16-bit words, or fp8 bytes.
std::vector<std::uint16_t> element_codes(std::optional<DType> fp8,
                                         const std::vector<std::uint16_t>& words) {
  if (!fp8) return words;
  std::vector<std::uint8_t> bytes(words.size() * 2);
  std::memcpy(bytes.data(), words.data(), bytes.size());
  return {bytes.begin(), bytes.end()};
}

// The cache after the call: appended slots hold k_new and v_new (k_new rotated, within an ulp
// of the fp64 rotation: the device rotates in fp32; in an fp8 cache quantized by the descales),
// every other slot keeps its bits.
void check_cache(const Case& c, const Setup& s, const Downloaded& got,
                 const DecodeReferenceResult& want) {
  const DType stored = c.fp8.value_or(c.dtype);
  struct Side {
    const char* name;
    const std::vector<double>& before;
    std::vector<double> after;
    std::vector<std::uint16_t> got;
    bool rotated;
  };
  const Side sides[] = {{"k", c.fp8 ? s.k_stored : s.inputs.k_cache,
                         c.fp8 ? stored_after(c, s, s.k_stored, want.k_cache, s.k_descale,
                                              want.k_token_descale, c.head_dim)
                               : want.k_cache,
                         element_codes(c.fp8, got.k_cache), s.problem.rotary_dim > 0},
                        {"v", c.fp8 ? s.v_stored : s.inputs.v_cache,
                         c.fp8 ? stored_after(c, s, s.v_stored, want.v_cache, s.v_descale,
                                              want.v_token_descale, c.dim_v())
                               : want.v_cache,
                         element_codes(c.fp8, got.v_cache), false}};
  // An ulp, relative at most, and the spacing of the smallest values.
  const double ulp = stored == DType::bf16   ? 0x1p-7
                     : stored == DType::f16  ? 0x1p-10
                     : stored == DType::e4m3 ? 0x1p-3
                                             : 0x1p-2;
  const double tiny = stored == DType::e4m3 ? 0x1p-9 : stored == DType::e5m2 ? 0x1p-16 : 0.0;
  for (const Side& side : sides) {
    const std::size_t per_slot = side.after.size() / want.appended.size();
    const std::vector<std::uint16_t> before = bits_of(stored, side.before);
    std::int64_t changed = 0, wrong = 0, first_wrong = -1;
    for (std::size_t i = 0; i < side.got.size(); ++i) {
      if (!want.appended[i / per_slot]) {
        changed += side.got[i] != before[i];
        continue;
      }
      const double g = kiln::test::from_bits(stored, side.got[i]), w = side.after[i];
      const bool ok = side.rotated ? std::fabs(g - w) <=
                                         std::max(ulp * std::max(std::fabs(g), std::fabs(w)), tiny)
                                   : side.got[i] == kiln::test::to_bits(stored, w);
      if (!ok && wrong++ == 0) first_wrong = static_cast<std::int64_t>(i);
    }
    INFO(side.name << " cache: " << changed << " elements changed that the append does not write; "
                   << wrong << " appended elements off, the first at " << first_wrong << " (slot "
                   << first_wrong / static_cast<std::int64_t>(per_slot) << ")");
    CHECK(changed == 0);
    CHECK(wrong == 0);
  }
}

// Token descales after the call: the appended slots' as the reference's (for rotated keys within
// an ulp of q's dtype, as their largest magnitude is), every other slot's kept.
void check_token_descales(const Case& c, const Setup& s, const Downloaded& got,
                          const DecodeReferenceResult& want) {
  const double ulp = c.dtype == DType::bf16 ? 0x1p-7 : 0x1p-10;
  struct Side {
    const char* name;
    const std::vector<double>& before;
    const std::vector<double>& after;
    const std::vector<std::uint32_t>& got;
    bool rotated;
  };
  const Side sides[] = {
      {"k", s.k_token, want.k_token_descale, got.k_token, s.problem.rotary_dim > 0},
      {"v", s.v_token, want.v_token_descale, got.v_token, false}};
  for (const Side& side : sides) {
    const std::vector<float> values = token_values(c, s.problem.cache, side.got);
    REQUIRE(values.size() == side.after.size());
    std::int64_t changed = 0, wrong = 0, first_wrong = -1;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double g = values[i];
      if (!want.appended[i / at(c.heads_kv)]) {
        changed += !(g == side.before[i] || (std::isnan(g) && std::isnan(side.before[i])));
        continue;
      }
      const double w = side.after[i];
      const bool ok = side.rotated ? std::fabs(g - w) <= ulp * std::fabs(w) : g == w;
      if (!ok && wrong++ == 0) first_wrong = static_cast<std::int64_t>(i);
    }
    INFO(side.name << " token descales: " << changed << " changed that the append does not write; "
                   << wrong << " appended ones off, the first at " << first_wrong);
    CHECK(changed == 0);
    CHECK(wrong == 0);
  }
}

void check_outputs(const Case& c, const Setup& s, const DeviceDecode& d, const Downloaded& got,
                   const DecodeReferenceResult& want) {
  check_out(*d.out, got.out, want.attention, c.heads, c.dim_v());
  if (c.lse) {
    check_lse(*d.lse, got.lse, want.lse);
  } else {
    CHECK(d.lse->written(got.lse) == 0);  // nothing asked, nothing written
  }
  check_cache(c, s, got, want);
  if (c.token_descales) check_token_descales(c, s, got, want);
}

// Runs `c` twice and checks out, lse and the cache against the reference, the guards, and that
// the second call (the same append onto the cache the first left) changes no bit.
void run_case(kiln::Runtime& rt, const Case& c, std::mt19937& rng) {
  INFO(describe(c));
  const Setup s = make_setup(c, rng);
  const DecodeReferenceResult want = kiln::test::decode_reference(s.problem, s.inputs);
  DeviceDecode d = upload_case(c, s);
  const Downloaded first = run(rt, d);
  check_outputs(c, s, d, first, want);
  const bool same_bits = run(rt, d) == first;  // not CHECK(run() == first): it would print it all
  CHECK(same_bits);
}

}  // namespace

TEST_CASE("a decode problem gives its config and specs without a call", "[decode]") {
  kiln::DecodeProblem problem{.head_dim = 128,
                              .head_dim_v = 128,
                              .rows_per_kv_head = 4,
                              .append = true,
                              .batch = 1,
                              .heads_kv = 8,
                              .capacity = 32768};
  // One sequence of many keys on 132 SMs: the heuristic splits them; a request caps the splits.
  CHECK(kiln::choose(problem, "sm_90a", 132).num_splits > 1);
  problem.requested_splits = 3;
  CHECK(kiln::choose(problem, "sm_90a", 132).num_splits == 3);
  problem.capacity = 16;  // one step of keys: one split whatever is asked
  CHECK(kiln::choose(problem, "sm_90a", 132).num_splits == 1);
  const std::vector<kiln::KernelSpec> specs =
      kiln::decode_specs(problem, kiln::choose(problem, "sm_90a", 132));
  REQUIRE(specs.size() == 2);
  CHECK(specs[0].source == "attention/decode/append.cuh");
  CHECK(specs[1].source == "attention/decode/attention.cuh");
  problem.append = false;
  CHECK(kiln::decode_specs(problem, {}).size() == 1);
  problem.token_descales = true;  // an fp8 cache's only
  CHECK_THROWS_WITH(kiln::decode_specs(problem, {}),
                    Catch::Contains("token_descales with a bf16 KV cache"));
  problem.dtype_kv = kiln::DType::e4m3;
  CHECK(kiln::test::contains(kiln::to_string(kiln::decode_specs(problem, {})[0]),
                             "token_descales=true"));
}

TEST_CASE("decode over contiguous and paged caches of ragged lengths", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(1);
  // Sequence 0 has no keys: out 0 and lse -inf. Page 1 puts every key on its own page; 256 puts
  // the longest sequence on two.
  for (DType dtype : kDTypes) {
    for (int page_size : {0, 1, 16, 256}) {
      run_case(rt, {.dtype = dtype, .page_size = page_size}, rng);
    }
  }
  // Past each sequence's end the cache holds NaN: the tail of a sequence's last page, whole
  // pages of its block table and rows no sequence owns.
  for (int page_size : {0, 16}) {
    run_case(rt, {.seqlens = {0, 1, 17, 33, 300}, .page_size = page_size, .nan_slots = true}, rng);
  }
  // Without the lse output, and with a page size that is not a power of two.
  run_case(rt, {.seqlens = {5, 64, 1}, .page_size = 48, .lse = false}, rng);
}

// An fp8 cache, e4m3 and e5m2 under bf16 and f16 q, converted exactly as it is read: contiguous
// and paged, with and without FlashAttention-3's descales (one per sequence and kv head), split
// and not, GQA with four speculative queries under causal, a window and softcap, head dims 64,
// 128 and 256/128. The reference attends the stored values times the descales.
TEST_CASE("decode over fp8 caches: e4m3 and e5m2, descales, paged, split, masks", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  const kiln::Target target = rt.target();
  if (target.arch() < 89) {
    WARN("skipped: an fp8 cache needs sm_89 or newer, not " << target.name());
    return;
  }
  std::mt19937 rng(21);
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (DType dtype : kDTypes) {
      for (int page_size : {0, 16}) {
        run_case(rt, {.dtype = dtype, .page_size = page_size, .fp8 = fp8, .descales = true}, rng);
      }
    }
  }
  run_case(rt, {.seqlens = {3, 2000, 700}, .num_splits = 7, .fp8 = DType::e4m3, .descales = true},
           rng);
  // Shuffled cache rows, NaN where no sequence reads, descales transposed and broadcast; head
  // dims 80 and 96, whose fp8 rows swizzle otherwise than their 16-bit ones.
  run_case(rt,
           {.batch_idx = true,
            .nan_slots = true,
            .fp8 = DType::e4m3,
            .descales = true,
            .descale_layout = Case::Descales::transposed},
           rng);
  for (int dim : {80, 96}) {
    run_case(rt,
             {.head_dim = dim,
              .page_size = 16,
              .nan_slots = true,
              .fp8 = DType::e5m2,
              .descales = true,
              .descale_layout = Case::Descales::one},
             rng);
  }
  run_case(rt,
           {.heads = 16,
            .heads_kv = 2,
            .head_dim = 64,
            .seqlen_q = 4,
            .seqlens = {0, 1, 40, 333},
            .page_size = 1,
            .score = {.causal = true, .softcap = 30},
            .fp8 = DType::e4m3,
            .descales = true},
           rng);
  run_case(rt,
           {.dtype = DType::f16,
            .head_dim = 256,
            .head_dim_v = 128,
            .seqlens = {100, 517},
            .score = {.window_left = 64},
            .fp8 = DType::e5m2,
            .descales = true},
           rng);
  // Appends, quantized by the descales: plain and paged, rotary (rounded to q's dtype, then
  // quantized), values past e4m3's 448 saturating, e5m2 under one descale, none without.
  for (int page_size : {0, 16}) {
    run_case(rt, {.seqlen_new = 3, .page_size = page_size, .fp8 = DType::e4m3, .descales = true},
             rng);
  }
  run_case(rt,
           {.seqlens = {5, 64, 200},
            .seqlen_new = 2,
            .score = {.causal = true},
            .rotary = Rotary::neox,
            .fp8 = DType::e4m3,
            .descales = true},
           rng);
  run_case(rt,
           {.heads = 4,
            .heads_kv = 4,
            .head_dim = 64,
            .seqlens = {7, 90},
            .seqlen_new = 4,
            .new_scale = 300,
            .page_size = 16,
            .rotary = Rotary::interleaved,
            .fp8 = DType::e4m3,
            .descales = true},
           rng);
  // bf16: f16 could hold neither these k_new and v_new nor the output they give.
  run_case(rt,
           {.seqlen_new = 1,
            .new_scale = 20000,
            .fp8 = DType::e5m2,
            .descales = true,
            .descale_layout = Case::Descales::one},
           rng);
  run_case(rt, {.seqlens = {30, 1}, .seqlen_new = 5, .fp8 = DType::e4m3}, rng);
}

// Descales per (token, kv head), with FlashAttention-3's or alone: contiguous, paged by 16 (which
// choose()'s 32-key fp8 tiles cross) and by 48, head-major, split; appends that give each new row
// its own descale (rotary; values far past e4m3's range, which the descale takes in without
// saturating; NaN where no sequence reads).
TEST_CASE("decode over fp8 caches with descales per token and kv head", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  if (rt.target().arch() < 89) {
    WARN("skipped: an fp8 cache needs sm_89 or newer, not " << rt.target().name());
    return;
  }
  std::mt19937 rng(33);
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (int page_size : {0, 16}) {
      run_case(rt,
               {.dtype = fp8 == DType::e4m3 ? DType::bf16 : DType::f16,
                .page_size = page_size,
                .fp8 = fp8,
                .descales = page_size == 0,
                .token_descales = true},
               rng);
    }
  }
  run_case(rt,
           {.seqlens = {3, 2000, 700},
            .page_size = 48,
            .num_splits = 5,
            .fp8 = DType::e4m3,
            .token_descales = true,
            .head_major = true},
           rng);
  run_case(rt,
           {.seqlens = {5, 64, 200},
            .seqlen_new = 3,
            .new_scale = 1000,
            .page_size = 16,
            .score = {.causal = true},
            .rotary = Rotary::neox,
            .fp8 = DType::e4m3,
            .descales = true,
            .token_descales = true},
           rng);
  run_case(rt,
           {.dtype = DType::f16,
            .seqlen_new = 2,
            .batch_idx = true,
            .nan_slots = true,
            .fp8 = DType::e5m2,
            .token_descales = true,
            .head_major = true},
           rng);
}

// Configs of 16-, 32- and 64-key tiles (1, 4 and 2 row tiles) over pages of 16, which the longer
// tiles cross in pieces of 16 keys, each within a page, and of 24, whose pieces cross pages too
// (read key by key): fp8 caches with both kinds of descales (NaN in the slots no sequence reads,
// descales too) and bf16 caches, GQA with four speculative queries under causal, split in two.
TEST_CASE("decode tiles that cross pages: explicit configs over pages of 16 and 24",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  const bool fp8 = rt.target().arch() >= 89;
  if (!fp8) WARN("fp8 caches skipped: they need sm_89 or newer, not " << rt.target().name());
  std::mt19937 rng(34);
  for (const auto& [block_n, m_tiles] : {std::pair{16, 1}, std::pair{32, 4}, std::pair{64, 2}}) {
    for (int page_size : {16, 24}) {
      for (bool cache_fp8 : {true, false}) {
        if (cache_fp8 && !fp8) continue;
        Case c{
            .heads = 32,
            .heads_kv = 2,
            .head_dim = 64,
            .seqlen_q = 4,
            .seqlens = {0, 1, 40, 333},
            .page_size = page_size,
            .score = {.causal = true},
            .config = kiln::DecodeConfig{
                .num_splits = 2, .block_n = block_n, .warps = 4, .stages = 2, .m_tiles = m_tiles}};
        if (cache_fp8) {
          c.fp8 = DType::e4m3;
          c.descales = true;
          c.token_descales = true;
          c.nan_slots = true;
        }
        run_case(rt, c, rng);
      }
    }
  }
}

TEST_CASE("decode GQA ratios 1, 2, 4, 8 and MQA, one query or four with causal", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(2);
  for (auto [heads, heads_kv] : {std::pair{2, 2}, {4, 2}, {8, 2}, {16, 2}, {8, 1}}) {
    Case c{.heads = heads, .heads_kv = heads_kv, .seqlens = {0, 1, 3, 40, 200}};
    run_case(rt, c, rng);
    // Speculative decoding: four queries, bottom-right causal, so the queries of a sequence of
    // one key are all masked but the last.
    c.seqlen_q = 4;
    c.score.causal = true;
    run_case(rt, c, rng);
    c.page_size = 16;
    run_case(rt, c, rng);
  }
}

TEST_CASE("decode split-KV over a long cache: 1, 2, 7, 64 splits and the heuristic",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(3);
  const int sms = rt.device_info().multiprocessors;
  for (int splits : {1, 2, 7, 0, 64}) {
    const kiln::DecodeConfig config = kiln::choose({.head_dim = 128,
                                                    .head_dim_v = 128,
                                                    .rows_per_kv_head = 4,
                                                    .batch = 3,
                                                    .heads_kv = 2,
                                                    .capacity = 3005,
                                                    .requested_splits = splits},
                                                   rt.target(), sms);
    INFO("choose gives " << config.num_splits << " splits for " << splits << " asked");
    CHECK(config.num_splits >= 1);
    CHECK(config.num_splits <= (splits ? splits : 128));
    run_case(rt, {.seqlens = {3000, 2111, 1}, .num_splits = splits}, rng);
  }
  // Paged, with four causal queries per sequence.
  for (int splits : {7, 0}) {
    run_case(rt,
             {.seqlen_q = 4,
              .seqlens = {3000, 2111, 1},
              .page_size = 16,
              .score = {.causal = true},
              .num_splits = splits},
             rng);
  }
  // Short sequences split into many ranges leave some ranges without keys.
  run_case(rt, {.seqlens = {0, 1, 9, 100}, .num_splits = 64}, rng);
}

TEST_CASE("decode with cache_batch_idx: sequences in shuffled cache rows", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(4);
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype, .seqlens = {5, 0, 300, 1}, .batch_idx = true};
    run_case(rt, c, rng);
    c.seqlen_q = 2;
    c.seqlen_new = 2;
    c.score.causal = true;
    c.num_splits = 3;
    run_case(rt, c, rng);
  }
}

TEST_CASE("decode appends k_new and v_new before attending", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(5);
  // Appends into an empty sequence, across page boundaries (15 + 1 fills a page of 16, 16 + 4
  // starts one) and into the last free slots (capacity 305 = 300 + 5).
  for (int page_size : {0, 1, 16, 256}) {
    Case c{.seqlens = {0, 1, 15, 16, 300}, .seqlen_new = 1, .page_size = page_size};
    run_case(rt, c, rng);
    c.seqlen_new = 5;
    c.seqlen_q = 5;
    c.score.causal = true;
    c.capacity = 305;
    run_case(rt, c, rng);
  }
  // f16; more new keys than queries; without causal a query sees the keys appended after it.
  for (bool causal : {false, true}) {
    run_case(rt,
             {.dtype = DType::f16,
              .seqlen_q = 2,
              .seqlens = {7, 0, 64},
              .seqlen_new = 3,
              .page_size = 16,
              .score = {.causal = causal},
              .num_splits = 2},
             rng);
  }
}

TEST_CASE("decode rotary, interleaved and GPT-NeoX, with and without a band", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(6);
  // With a band q token i sits at seqlens[b] + i, without one every q token at seqlens[b].
  for (Rotary rotary : {Rotary::neox, Rotary::interleaved}) {
    for (bool causal : {false, true}) {
      Case c{.seqlens = {0, 1, 40, 200},
             .seqlen_new = 1,
             .score = {.causal = causal},
             .rotary = rotary};
      run_case(rt, c, rng);
      c.seqlen_q = c.seqlen_new = 3;
      c.page_size = 16;
      run_case(rt, c, rng);
      c.rotary_dim = 64;  // half the head rotated, half left alone
      c.dtype = DType::f16;
      run_case(rt, c, rng);
    }
    // A window without causal is a band too.
    run_case(rt,
             {.seqlen_q = 3,
              .seqlens = {10, 200},
              .seqlen_new = 3,
              .score = {.window_left = 16},
              .rotary = rotary},
             rng);
  }
}

TEST_CASE("decode sliding windows, softcap and ALiBi", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(7);
  for (int seqlen_q : {1, 4}) {
    Case c{.seqlen_q = seqlen_q, .seqlens = {0, 1, 20, 300}};
    c.score.window_left = 32;  // keys right of the diagonal stay visible: window_right unbounded
    run_case(rt, c, rng);
    c.score.causal = true;
    c.page_size = 16;
    run_case(rt, c, rng);
    // causal takes any window_right as 0, as FlashAttention: Hugging Face's sliding-window
    // layers pass causal with (w - 1, w - 1).
    c.score.window_right = 31;
    run_case(rt, c, rng);
    c.score.causal = false;
    c.score.window_left = 0;
    c.score.window_right = 2;
    c.score.top_left = true;
    run_case(rt, c, rng);

    // Logits of std 1 barely reach a cap of 30: cap them at 2, or raise them to std 11 under 10.
    c = {.seqlen_q = seqlen_q, .seqlens = {0, 1, 20, 300}, .score = {.softcap = 2}};
    run_case(rt, c, rng);
    c.score.softcap = 10;
    c.score.softmax_scale = 1.0f;
    c.score.causal = true;
    c.num_splits = 3;
    run_case(rt, c, rng);

    for (Alibi alibi : {Alibi::per_head, Alibi::per_batch_head}) {
      c = {.seqlen_q = seqlen_q,
           .seqlens = {0, 1, 20, 300},
           .score = {.causal = true, .alibi = alibi}};
      run_case(rt, c, rng);
    }
  }
}

TEST_CASE("decode head dims 64, 72, 128, 256 and 192/128", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(8);
  // One case a dim (each compiles its own kernels), features spread over them.
  run_case(rt, {.head_dim = 64, .seqlens = {0, 1, 77, 300}}, rng);
  run_case(rt,
           {.dtype = DType::f16,
            .head_dim = 72,
            .seqlen_q = 4,
            .seqlens = {1, 77, 300},
            .seqlen_new = 4,
            .page_size = 16,
            .score = {.causal = true},
            .num_splits = 3},
           rng);
  run_case(rt, {.head_dim = 256, .seqlens = {0, 1, 77, 300}, .page_size = 16, .num_splits = 3},
           rng);
  run_case(rt,
           {.head_dim = 192,
            .head_dim_v = 128,
            .seqlen_q = 2,
            .seqlens = {0, 1, 300},
            .seqlen_new = 2,
            .page_size = 16,
            .score = {.causal = true},
            .num_splits = 4},
           rng);
}

// What choose() plans for GPUs with 99 KiB of shared memory per CTA (sm_86, sm_89, sm_120):
// two stages at head dim 128, and two warps of two stages at 256, three at 256/128 with two row
// tiles; launched here on whatever device runs the test, through the config overload.
TEST_CASE("decode with the configs of 99 KiB targets", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(86);
  const kiln::Target sm89("sm_89");
  // Head dims, queries (times 8 heads a kv head: the packed rows), and the warps and stages
  // planned for sm_89.
  for (const auto& [dim, dim_v, seqlen_q, warps, stages] :
       {std::tuple{128, 128, 1, 4, 2}, std::tuple{256, 256, 1, 2, 2}, std::tuple{256, 256, 4, 2, 2},
        std::tuple{256, 128, 4, 3, 2}}) {
    kiln::DecodeConfig planned = kiln::choose(
        {.head_dim = dim, .head_dim_v = dim_v, .rows_per_kv_head = 8 * seqlen_q}, sm89, 132);
    CHECK(planned.warps == warps);
    CHECK(planned.stages == stages);
    for (const int splits : {1, 3}) {
      planned.num_splits = splits;
      run_case(rt,
               {.heads = 16,
                .heads_kv = 2,
                .head_dim = dim,
                .head_dim_v = dim_v,
                .seqlen_q = seqlen_q,
                .seqlens = {0, 1, 77, 300, 1000},
                .page_size = splits == 3 ? 16 : 0,
                .score = {.causal = seqlen_q > 1},
                .config = planned},
               rng);
    }
  }
}

// The counters that move when a call fetches a kernel: compiled, found on disk or in memory, or
// loaded.
std::uint64_t kernel_fetches(const kiln::Stats& s) {
  return s.compiles + s.compile_failures + s.disk_hits + s.memory_hits + s.loads;
}

// A refused call changes nothing: the fit against the device comes before the append kernel
// writes k_new and v_new into the cache, and before any kernel is compiled or fetched.
TEST_CASE("decode with new keys and a config the device cannot run leaves the cache untouched",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(15);
  // 16 warps of 8 stages of 128 keys at head dim 128 take 8 MiB of shared memory per CTA: within
  // the kernel's ranges, past every device's.
  for (const int page_size : {0, 16}) {
    const Case c{.seqlens = {0, 17, 300},
                 .seqlen_new = 3,
                 .page_size = page_size,
                 .config = kiln::DecodeConfig{.block_n = 128, .warps = 16, .stages = 8}};
    INFO(describe(c));
    const Setup s = make_setup(c, rng);
    DeviceDecode d = upload_case(c, s);
    d.out->poison();
    d.lse->poison();
    kiln::test::sync_and_check();
    const Downloaded before = download(d);
    const std::uint64_t fetches = kernel_fetches(rt.stats());
    CHECK_THROWS_WITH(
        kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, *c.config, nullptr, rt),
        Catch::Contains("bytes of dynamic shared memory per CTA") &&
            Catch::Contains("block_n 128, warps 16, stages 8"));
    kiln::test::sync_and_check();
    const bool unchanged = download(d) == before;  // the cache, out and lse, bit for bit
    CHECK(unchanged);
    CHECK(kernel_fetches(rt.stats()) == fetches);
  }
}

// Sinks count once per row whatever the split: split-KV puts them in split 0's state only.
TEST_CASE("decode sinks over contiguous and paged caches with split-KV GQA and windows",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(18);
  for (DType dtype : kDTypes) {
    for (int splits : {1, 0, 7}) {
      for (int page_size : {0, 16}) {
        run_case(rt,
                 {.dtype = dtype,
                  .seqlens = {0, 1, 17, 2000, 129},
                  .page_size = page_size,
                  .score = {.sinks = true},
                  .num_splits = splits},
                 rng);
      }
    }
  }
  // Four causal queries (the first ones of a one-key sequence see nothing), a sliding window,
  // appended keys, MQA, head dims 64 and 256.
  run_case(rt,
           {.heads = 8,
            .heads_kv = 1,
            .head_dim = 64,
            .seqlen_q = 4,
            .seqlens = {0, 1, 300, 1000},
            .seqlen_new = 1,
            .score = {.causal = true, .window_left = 40, .sinks = true},
            .num_splits = 5},
           rng);
  run_case(rt,
           {.head_dim = 256,
            .seqlens = {3, 0, 600},
            .page_size = 16,
            .score = {.alibi = Alibi::per_head, .sinks = true},
            .num_splits = 3},
           rng);
}

TEST_CASE("decode with user variants: ALiBi and key padding and sink hooks",
          "[gpu][decode][variant]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(20);
  for (int splits : {1, 5}) {
    run_case(rt,
             {.seqlens = {0, 1, 17, 900},
              .score = {.variant = UserVariant::alibi},
              .num_splits = splits},
             rng);
    run_case(rt,
             {.seqlen_q = 4,
              .seqlens = {1, 300, 64},
              .seqlen_new = 4,
              .page_size = 16,
              .score = {.causal = true, .sinks = true, .variant = UserVariant::alibi},
              .num_splits = splits},
             rng);
    // The last sequence is all padding.
    run_case(rt,
             {.heads = 8,
              .heads_kv = 2,
              .seqlens = {0, 700, 33, 90},
              .score = {.variant = UserVariant::key_padding},
              .num_splits = splits},
             rng);
    run_case(rt,
             {.heads = 4,
              .heads_kv = 1,
              .seqlen_q = 3,
              .seqlens = {20, 400},
              .seqlen_new = 3,
              .page_size = 16,
              .score = {.causal = true, .sinks = true, .variant = UserVariant::row_sinks},
              .num_splits = splits},
             rng);
    run_case(rt,
             {.seqlens = {0, 250, 9},
              .score = {.window_left = 100, .variant = UserVariant::softmax_one},
              .num_splits = splits},
             rng);
  }
}

TEST_CASE("decode with every feature at once", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(9);
  for (DType dtype : kDTypes) {
    run_case(rt,
             {.dtype = dtype,
              .heads = 16,
              .heads_kv = 2,
              .seqlen_q = 3,
              .seqlens = {0, 1, 45, 500},
              .seqlen_new = 3,
              .page_size = 16,
              .score = {.causal = true,
                        .window_left = 64,
                        .softcap = 5,
                        .alibi = Alibi::per_batch_head,
                        .sinks = true},
              .rotary = Rotary::interleaved,
              .num_splits = 3,
              .nan_slots = true},
             rng);
    run_case(rt,
             {.dtype = dtype,
              .heads = 8,
              .heads_kv = 1,
              .seqlen_q = 2,
              .seqlens = {31, 0, 250},
              .seqlen_new = 2,
              .batch_idx = true,
              .score = {.causal = true, .softcap = 5, .alibi = Alibi::per_head},
              .rotary = Rotary::neox,
              .rotary_dim = 32,
              .num_splits = 0},
             rng);
  }
}

TEST_CASE("decode split-KV is right whatever its scratch held", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(12);
  // The splits' partial states live in scratch from the device's default pool, handed out in
  // stream order: a block filled and freed on the call's stream just before is what the call
  // gets (the pool keeps freed memory while its release threshold is high). First every byte
  // 0xff, then random words below 2^48, the range of the flags' tags.
  cudaMemPool_t pool = nullptr;
  KILN_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
  std::uint64_t threshold = 0;
  KILN_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
  KILN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  constexpr std::size_t kWords = std::size_t{1} << 22;  // 32 MiB, more than the call takes
  std::vector<std::uint64_t> tag_like(kWords);
  for (std::uint64_t& word : tag_like) word = (std::uint64_t{rng()} << 32 | rng()) >> 16;
  const Case c{.seqlens = {3000, 2111, 1, 700}, .num_splits = 7};
  for (bool ones : {true, false}) {
    INFO((ones ? "scratch of 0xff bytes" : "scratch of tag-like words"));
    const Setup s = make_setup(c, rng);
    const DecodeReferenceResult want = kiln::test::decode_reference(s.problem, s.inputs);
    DeviceDecode d = upload_case(c, s);
    d.out->poison();
    d.lse->poison();
    void* dirty = nullptr;
    KILN_CUDA_CHECK(cudaMallocAsync(&dirty, kWords * sizeof(std::uint64_t), nullptr));
    if (ones) {
      KILN_CUDA_CHECK(cudaMemsetAsync(dirty, 0xff, kWords * sizeof(std::uint64_t), nullptr));
    } else {
      KILN_CUDA_CHECK(cudaMemcpyAsync(dirty, tag_like.data(), kWords * sizeof(std::uint64_t),
                                      cudaMemcpyHostToDevice, nullptr));
    }
    KILN_CUDA_CHECK(cudaFreeAsync(dirty, nullptr));
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, nullptr, rt);
    kiln::test::sync_and_check();
    check_outputs(c, s, d, download(d), want);
  }
  KILN_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
}

namespace {

template <class T>
void copy_async(const TensorView& to, const std::vector<T>& from, cudaStream_t stream) {
  KILN_CUDA_CHECK(cudaMemcpyAsync(to.data, from.data(), from.size() * sizeof(T),
                                  cudaMemcpyHostToDevice, stream));
}

}  // namespace

TEST_CASE("decode step captured in a CUDA graph, replayed with new cache lengths",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Options options = kiln::test::gpu_options();
  options.debug = false;  // the debug checks copy to the host, which a capture forbids
  kiln::Runtime rt(options);
  std::mt19937 rng(10);
  // One token appended per sequence and four splits, so the graph holds the append, the split
  // attention, the combine and the scratch's allocation and release.
  Case c{
      .seqlens = {40, 0, 200}, .seqlen_new = 1, .page_size = 16, .capacity = 512, .num_splits = 4};
  Setup s = make_setup(c, rng);
  DeviceDecode d = upload_case(c, s);
  kiln::test::GraphOnStream g;
  const auto call = [&] {
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, g.stream, rt);
  };

  // An eager step first, on the same stream: it compiles and loads the kernels, which a capture
  // cannot do (as with any library, warm up before capturing).
  DecodeReferenceResult want = kiln::test::decode_reference(s.problem, s.inputs);
  {
    INFO("eager step: " << describe(c));
    d.out->poison();
    d.lse->poison();
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // a non-blocking stream does not wait for it
    call();
    KILN_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    kiln::test::sync_and_check();
    check_outputs(c, s, d, download(d), want);
  }
  g.capture(call);

  // Each replay: the caller advances the lengths (or jumps: a new sequence in a slot, one that
  // fills its last free slot) and writes new q and new tokens into the same buffers.
  for (const std::vector<int>& seqlens : {std::vector<int>{41, 1, 201}, {300, 0, 511}}) {
    c.seqlens = seqlens;
    INFO("replay: " << describe(c));
    s.problem.seqlens = seqlens;
    s.inputs.k_cache = want.k_cache;
    s.inputs.v_cache = want.v_cache;
    randomize_queries(c, s, rng);
    want = kiln::test::decode_reference(s.problem, s.inputs);

    d.out->poison();
    d.lse->poison();
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // the poison runs on the legacy stream
    const auto q = bits_of(c.dtype, s.inputs.q), k_new = bits_of(c.dtype, s.inputs.k_new),
               v_new = bits_of(c.dtype, s.inputs.v_new);
    copy_async(d.cache.seqlens, seqlens, g.stream);
    copy_async(d.q, q, g.stream);
    copy_async(*d.options.k_new, k_new, g.stream);
    copy_async(*d.options.v_new, v_new, g.stream);
    KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, g.stream));
    KILN_CUDA_CHECK(cudaStreamSynchronize(g.stream));
    kiln::test::sync_and_check();
    check_outputs(c, s, d, download(d), want);
  }
}

TEST_CASE("decode split-KV flags kept per stream: streams at once, growth, more streams than kept",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(13);
  // Two streams running at once, each with a call that needs few flag words, then one that needs
  // more than the stream keeps, three rounds each, so their calls interleave on the device.
  std::array<cudaStream_t, 2> streams{};
  for (cudaStream_t& stream : streams) {
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  for (const Case& c : {Case{.seqlens = {900, 31}, .num_splits = 5},
                        Case{.seqlens = {3000, 2111, 1, 700, 1500, 64}, .num_splits = 16}}) {
    INFO(describe(c));
    std::vector<Setup> setups;
    std::vector<DecodeReferenceResult> wants;
    std::vector<DeviceDecode> devices;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      setups.push_back(make_setup(c, rng));
      wants.push_back(kiln::test::decode_reference(setups[i].problem, setups[i].inputs));
      devices.push_back(upload_case(c, setups[i]));
      devices[i].out->poison();
      devices[i].lse->poison();
    }
    KILN_CUDA_CHECK(cudaDeviceSynchronize());  // non-blocking streams do not wait for the poison
    for (int round = 0; round < 3; ++round) {
      for (std::size_t i = 0; i < streams.size(); ++i) {
        DeviceDecode& d = devices[i];
        kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, streams[i], rt);
      }
    }
    kiln::test::sync_and_check();
    for (std::size_t i = 0; i < streams.size(); ++i) {
      check_outputs(c, setups[i], devices[i], download(devices[i]), wants[i]);
      // The calls left the stream's flags zero for the next one (these calls' flags take less
      // than the 256 bytes read).
      const std::shared_ptr<void> flags = kiln::detail::stream_zeros(rt, 256, streams[i]);
      REQUIRE(flags != nullptr);
      std::array<std::uint64_t, 32> words{};
      KILN_CUDA_CHECK(cudaMemcpy(words.data(), flags.get(), sizeof words, cudaMemcpyDeviceToHost));
      CHECK(std::all_of(words.begin(), words.end(), [](std::uint64_t w) { return w == 0; }));
    }
  }
  for (cudaStream_t stream : streams) KILN_CUDA_CHECK(cudaStreamDestroy(stream));

  // A stream each call, more than keep flags: the streams beyond take zeroed scratch, and every
  // call is still right.
  const Case c{.seqlens = {700, 90}, .num_splits = 3};
  INFO(describe(c));
  const Setup s = make_setup(c, rng);
  const DecodeReferenceResult want = kiln::test::decode_reference(s.problem, s.inputs);
  DeviceDecode d = upload_case(c, s);
  for (std::size_t i = 0; i < kiln::detail::StreamZeros::kStreams + 3; ++i) {
    INFO("stream " << i);
    cudaStream_t stream = nullptr;
    KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    d.out->poison();
    d.lse->poison();
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, stream, rt);
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
    KILN_CUDA_CHECK(cudaStreamDestroy(stream));
    kiln::test::sync_and_check();
    check_outputs(c, s, d, download(d), want);
  }
}

TEST_CASE("a kernel not loaded yet fails a call under graph capture, naming its spec",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Options options = kiln::test::gpu_options();
  options.debug = false;
  kiln::Runtime rt(options);  // nothing loaded yet
  std::mt19937 rng(14);
  const Case c{.seqlens = {40, 200}, .num_splits = 2};
  const Setup s = make_setup(c, rng);
  const DecodeReferenceResult want = kiln::test::decode_reference(s.problem, s.inputs);
  DeviceDecode d = upload_case(c, s);
  const auto call = [&](cudaStream_t stream) {
    kiln::attention_with_kvcache(d.q, d.cache, d.out_view, d.options, stream, rt);
  };
  {
    kiln::test::GraphOnStream g;
    const auto captured = [&] { g.capture([&] { call(g.stream); }); };
    CHECK_THROWS_WITH(captured(), Catch::Contains("not warmed") &&
                                      Catch::Contains("attention/decode/attention.cuh") &&
                                      Catch::Contains("warm these specs before capturing"));
  }
  // Nothing was left broken: the same call runs eagerly, and then captures and replays.
  kiln::test::GraphOnStream g;
  d.out->poison();
  d.lse->poison();
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  call(g.stream);
  KILN_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  kiln::test::sync_and_check();
  check_outputs(c, s, d, download(d), want);
  g.capture([&] { call(g.stream); });
  d.out->poison();
  d.lse->poison();
  KILN_CUDA_CHECK(cudaDeviceSynchronize());
  KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, g.stream));
  KILN_CUDA_CHECK(cudaStreamSynchronize(g.stream));
  kiln::test::sync_and_check();
  check_outputs(c, s, d, download(d), want);
}

// ---------------------------------------------------------------------------------------------
// merge_states

namespace {

struct MergeCase {
  DType in = DType::f32;
  DType out = DType::f32;
  bool two = true;  // merge_states' two-state form; states must be 2
  int tokens = 37;
  int states = 2;
  int heads = 5;
  int dim = 64;
  bool out_lse = true;
};

std::string describe(const MergeCase& c) {
  std::ostringstream s;
  s << (c.two ? "two states " : "many states ") << kiln::to_string(c.in) << " -> "
    << kiln::to_string(c.out) << " tokens " << c.tokens << " states " << c.states << " heads "
    << c.heads << " dim " << c.dim << (c.out_lse ? " lse out" : "");
  return s.str();
}

// LSEs in [-5, 5], -inf in a pattern by token: state 0 empty, the last state empty, all empty.
std::vector<double> random_lse(const MergeCase& c, std::mt19937& rng) {
  std::uniform_real_distribution<double> uniform(-5.0, 5.0);
  std::vector<double> lse(at(std::int64_t{c.tokens} * c.states * c.heads));
  for (std::size_t i = 0; i < lse.size(); ++i) {
    const std::size_t token = i / at(c.states * c.heads), state = i / at(c.heads) % at(c.states);
    const bool empty = (token % 5 == 1 && state == 0) ||
                       (token % 5 == 2 && state == at(c.states) - 1) || token % 5 == 3;
    lse[i] = empty ? -kInf : static_cast<float>(uniform(rng));
  }
  return lse;
}

// The reference's lse (heads, tokens) in merge_states' order (tokens, heads).
std::vector<double> tokens_major(const std::vector<double>& lse, int tokens, int heads) {
  std::vector<double> out(lse.size());
  for (std::size_t t = 0; t < at(tokens); ++t) {
    for (std::size_t h = 0; h < at(heads); ++h) out[t * at(heads) + h] = lse[h * at(tokens) + t];
  }
  return out;
}

void run_merge(kiln::Runtime& rt, const MergeCase& c, std::mt19937& rng) {
  INFO(describe(c));
  const std::int64_t tokens = c.tokens, states = c.states, heads = c.heads, dim = c.dim;
  // Both forms read v (tokens, states, heads, dim) and s (tokens, states, heads); the two-state
  // form sees states 0 and 1 through strided views of them.
  const auto v = kiln::test::random_normal(c.in, at(tokens * states * heads * dim), rng);
  const auto s = random_lse(c, rng);
  const ReferenceResult want =
      kiln::test::merge_reference(c.out, c.tokens, c.states, c.heads, c.dim, v, s);
  const auto v_buffer = upload_values(c.in, v);
  const auto s_buffer = upload_values(DType::f32, s);
  Output out(c.out, Strided::dense({tokens, heads, dim}));
  Output out_lse(DType::f32, Strided::dense({tokens, heads}));
  const TensorView out_view = out.view();
  const TensorView out_lse_view = out_lse.view();
  const TensorView* s_out = c.out_lse ? &out_lse_view : nullptr;
  out.poison();
  out_lse.poison();
  if (c.two) {
    REQUIRE(c.states == 2);
    const auto state_view = [&](const DeviceBuffer& buffer, DType dtype, std::int64_t state,
                                bool is_v) {
      TensorView t;
      t.data = static_cast<std::byte*>(buffer.get()) +
               state * heads * (is_v ? dim : 1) * static_cast<std::int64_t>(kiln::size_of(dtype));
      t.dtype = dtype;
      t.rank = is_v ? 3 : 2;
      t.shape = {tokens, heads, dim, 0};
      t.strides = {states * heads * (is_v ? dim : 1), is_v ? dim : 1, 1, 0};
      return t;
    };
    kiln::merge_states(state_view(*v_buffer, c.in, 0, true),
                       state_view(*s_buffer, DType::f32, 0, false),
                       state_view(*v_buffer, c.in, 1, true),
                       state_view(*s_buffer, DType::f32, 1, false), out_view, s_out, nullptr, rt);
  } else {
    kiln::merge_states(TensorView::contiguous(v_buffer->get(), c.in, {tokens, states, heads, dim}),
                       TensorView::contiguous(s_buffer->get(), DType::f32, {tokens, states, heads}),
                       out_view, s_out, nullptr, rt);
  }
  kiln::test::sync_and_check();
  check_out(out, out.bytes(), want, c.heads, c.dim);
  const auto lse_bytes = out_lse.bytes();
  if (c.out_lse) {
    check_lse(out_lse, lse_bytes, tokens_major(want.lse, c.tokens, c.heads));
  } else {
    CHECK(out_lse.written(lse_bytes) == 0);
  }
}

}  // namespace

TEST_CASE("merge_states of two states: f32, bf16 and f16, empty states, strided views",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(11);
  for (auto [in, out] : {std::pair{DType::f32, DType::f32},
                         {DType::bf16, DType::bf16},
                         {DType::f16, DType::f16},
                         {DType::f32, DType::bf16}}) {
    run_merge(rt, {.in = in, .out = out}, rng);
  }
  run_merge(rt, {.in = DType::bf16, .out = DType::bf16, .tokens = 1, .dim = 72, .out_lse = false},
            rng);
}

TEST_CASE("merge_states of many states: 1, 3 and 16 states, empty states", "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(12);
  for (int states : {1, 3, 16}) {
    run_merge(rt,
              {.in = DType::f32, .out = DType::bf16, .two = false, .states = states, .dim = 128},
              rng);
    run_merge(rt, {.in = DType::bf16, .out = DType::bf16, .two = false, .states = states}, rng);
  }
  run_merge(rt,
            {.in = DType::f32,
             .out = DType::f32,
             .two = false,
             .tokens = 9,
             .states = 5,
             .out_lse = false},
            rng);
}

namespace {

// A setup whose sequence b holds keys [from[b], to[b]) of `full`'s, with the same queries.
Setup key_range(const Case& c, const Setup& full, const std::vector<int>& from,
                const std::vector<int>& to) {
  Setup s = full;
  const auto k_slot = at(c.heads_kv * c.head_dim), v_slot = at(c.heads_kv * c.dim_v());
  for (int b = 0; b < c.batch(); ++b) {
    s.problem.seqlens[at(b)] = to[at(b)] - from[at(b)];
    for (int j = from[at(b)]; j < to[at(b)]; ++j) {
      const auto src = at(full.problem.cache.slot(b, j));
      const auto dst = at(s.problem.cache.slot(b, j - from[at(b)]));
      std::copy_n(&full.inputs.k_cache[src * k_slot], k_slot, &s.inputs.k_cache[dst * k_slot]);
      std::copy_n(&full.inputs.v_cache[src * v_slot], v_slot, &s.inputs.v_cache[dst * v_slot]);
    }
  }
  return s;
}

}  // namespace

TEST_CASE("merge_states of attention over keys 0..m and m..n is attention over keys 0..n",
          "[gpu][decode]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(13);
  // Sequence 0 has no keys on either side, 1 none in the first part, 4 none in the second.
  const std::vector<int> m = {0, 0, 77, 350, 50}, n = {0, 1, 200, 700, 50};
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype, .seqlens = n};
    const Setup full = make_setup(c, rng);
    const std::vector<int> zero(n.size(), 0);
    const Setup parts[] = {key_range(c, full, zero, m), key_range(c, full, m, n)};
    std::vector<std::unique_ptr<DeviceDecode>> devices;
    std::vector<DecodeReferenceResult> wants;
    for (const Setup& part : parts) {
      c.seqlens = part.problem.seqlens;
      INFO("part: " << describe(c));
      wants.push_back(kiln::test::decode_reference(part.problem, part.inputs));
      devices.push_back(std::make_unique<DeviceDecode>(upload_case(c, part)));
      check_outputs(c, part, *devices.back(), run(rt, *devices.back()), wants.back());
    }

    // Merge the parts' outputs as they are: seqlen_q 1 makes out (batch, heads, d) and lse
    // (batch, heads).
    const std::int64_t batch = c.batch(), heads = c.heads, dim = c.head_dim;
    Output out(dtype, Strided::dense({batch, heads, dim}));
    Output out_lse(DType::f32, Strided::dense({batch, heads}));
    out.poison();
    out_lse.poison();
    const TensorView out_lse_view = out_lse.view();
    const auto v_of = [&](const DeviceDecode& d) {
      return TensorView::contiguous(d.out->data(), dtype, {batch, heads, dim});
    };
    const auto s_of = [&](const DeviceDecode& d) {
      return TensorView::contiguous(d.lse->data(), DType::f32, {batch, heads});
    };
    kiln::merge_states(v_of(*devices[0]), s_of(*devices[0]), v_of(*devices[1]), s_of(*devices[1]),
                       out.view(), &out_lse_view, nullptr, rt);
    kiln::test::sync_and_check();

    // Against attention over all keys in fp64; the plain-dtype baseline is each part done
    // plainly in the dtype, merged and rounded to it.
    const DecodeReferenceResult whole = kiln::test::decode_reference(full.problem, full.inputs);
    std::vector<double> plain_states, lse_states;
    for (std::int64_t b = 0; b < batch; ++b) {
      for (const DecodeReferenceResult& part : wants) {
        const auto row = at(b * heads * dim);
        plain_states.insert(plain_states.end(), &part.attention.out_plain[row],
                            &part.attention.out_plain[row + at(heads * dim)]);
        lse_states.insert(lse_states.end(), &part.lse[at(b * heads)],
                          &part.lse[at((b + 1) * heads)]);
      }
    }
    ReferenceResult want = whole.attention;
    want.out_plain = kiln::test::merge_reference(dtype, c.batch(), 2, c.heads, c.head_dim,
                                                 plain_states, lse_states)
                         .out_plain;
    INFO("merged: " << kiln::to_string(dtype));
    check_out(out, out.bytes(), want, c.heads, c.head_dim);
    check_lse(out_lse, out_lse.bytes(), whole.lse);
  }
}
