// SPDX-License-Identifier: Apache-2.0
// The CPU decode reference: the cache as slots, the append and rotary in fp64, each sequence's
// keys gathered in order and handed to attention_reference as a varlen batch; and the merge.
#include "decode_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace kiln::test {

namespace {

std::size_t at(std::int64_t i) {
  return static_cast<std::size_t>(i);
}

}  // namespace

std::int64_t CacheMap::slot(int b, int j) const {
  if (paged()) {
    if (j / row_len >= max_pages) throw std::invalid_argument("CacheMap::slot: key past the pages");
    const int page = block_table.at(at(std::int64_t{b} * max_pages + j / row_len));
    return std::int64_t{page} * row_len + j % row_len;
  }
  const int row = batch_idx.empty() ? b : batch_idx.at(at(b));
  if (j >= row_len) throw std::invalid_argument("CacheMap::slot: key past the cache row");
  return std::int64_t{row} * row_len + j;
}

bool DecodeReferenceProblem::rotary_q_per_token() const {
  return attention.window_left >= 0 || attention.window_right >= 0;
}

void rotate(const DecodeReferenceProblem& p, double* x, int position) {
  const int half = p.rotary_dim / 2;
  const auto row = at(std::int64_t{position} * half);
  if (row + at(half) > p.rotary_cos.size() || p.rotary_cos.size() != p.rotary_sin.size()) {
    throw std::invalid_argument("rotate: position past the cos/sin tables");
  }
  for (int i = 0; i < half; ++i) {
    const int first = p.rotary_interleaved ? 2 * i : i;
    const int second = p.rotary_interleaved ? 2 * i + 1 : i + half;
    const double c = p.rotary_cos[row + at(i)], s = p.rotary_sin[row + at(i)];
    const double x1 = x[first], x2 = x[second];
    x[first] = round_to(p.attention.dtype, x1 * c - x2 * s);
    x[second] = round_to(p.attention.dtype, x1 * s + x2 * c);
  }
}

double saturate_to(DType dtype, double value) {
  const double largest = fp8_largest(dtype);
  return round_to(dtype, std::clamp(value, -largest, largest));
}

double row_descale(DType dtype, double largest, double head_descale) {
  const float descale = static_cast<float>(largest) /
                        (static_cast<float>(fp8_largest(dtype)) * static_cast<float>(head_descale));
  return descale > 0.f && descale <= std::numeric_limits<float>::max() ? descale : 1.0;
}

namespace {

// Slot elements [first, first + count) of sequence b's kv head h, as an fp8 cache keeps them
// (DecodeReferenceProblem::cache_fp8); with descales per token, `token_descale` is the slot's
// entry for the kv head, which this sets.
void quantize_appended(const DecodeReferenceProblem& p, const std::vector<double>& descales, int b,
                       int h, double* first, std::size_t count, double* token_descale) {
  const auto head = static_cast<float>(
      descales.empty() ? 1.0 : descales.at(at(std::int64_t{b} * p.attention.heads_kv + h)));
  float scale = head;
  if (token_descale != nullptr) {
    double largest = 0;
    for (std::size_t e = 0; e < count; ++e) largest = std::max(largest, std::fabs(first[e]));
    *token_descale = row_descale(*p.cache_fp8, largest, head);
    scale = head * static_cast<float>(*token_descale);
  }
  for (std::size_t e = 0; e < count; ++e) {
    first[e] = saturate_to(*p.cache_fp8, static_cast<float>(first[e]) / scale) * scale;
  }
}

}  // namespace

DecodeReferenceResult decode_reference(const DecodeReferenceProblem& p, const DecodeInputs& in) {
  const ReferenceProblem& a = p.attention;
  const int batch = p.batch();
  const auto heads = at(a.heads), d = at(a.head_dim), dv = at(a.head_dim_v);
  const std::size_t k_slot = at(a.heads_kv) * d, v_slot = at(a.heads_kv) * dv;
  const auto slots = at(p.cache.slots());
  const bool append = !in.k_new.empty();
  const auto new_tokens = at(std::int64_t{batch} * p.seqlen_new);
  if (in.q.size() != at(std::int64_t{batch} * p.seqlen_q) * heads * d ||
      in.k_cache.size() != slots * k_slot || in.v_cache.size() != slots * v_slot ||
      (append &&
       (in.k_new.size() != new_tokens * k_slot || in.v_new.size() != new_tokens * v_slot))) {
    throw std::invalid_argument("decode_reference: an input does not match the problem");
  }
  if (p.rotary_dim > 0 && !append) {
    throw std::invalid_argument("decode_reference: rotary needs k_new");
  }

  DecodeReferenceResult r;
  r.k_cache = in.k_cache;
  r.v_cache = in.v_cache;
  r.appended.assign(slots, false);
  r.k_token_descale = p.k_token_descale;
  r.v_token_descale = p.v_token_descale;
  const bool token_descales = !p.k_token_descale.empty();
  if (token_descales && (!p.cache_fp8 || p.k_token_descale.size() != slots * at(a.heads_kv) ||
                         p.v_token_descale.size() != slots * at(a.heads_kv))) {
    throw std::invalid_argument("decode_reference: token descales need an fp8 cache, one a slot");
  }
  // The append: token t of sequence b becomes key seqlens[b] + t, rotated at that position.
  for (int b = 0; append && b < batch; ++b) {
    for (int t = 0; t < p.seqlen_new; ++t) {
      const int position = p.seqlens[at(b)] + t;
      const auto slot = at(p.cache.slot(b, position));
      const auto token = at(std::int64_t{b} * p.seqlen_new + t);
      std::copy_n(&in.k_new[token * k_slot], k_slot, &r.k_cache[slot * k_slot]);
      std::copy_n(&in.v_new[token * v_slot], v_slot, &r.v_cache[slot * v_slot]);
      for (std::size_t h = 0; p.rotary_dim > 0 && h < at(a.heads_kv); ++h) {
        rotate(p, &r.k_cache[slot * k_slot + h * d], position);
      }
      for (int h = 0; p.cache_fp8 && h < a.heads_kv; ++h) {
        const std::size_t token_at = slot * at(a.heads_kv) + at(h);
        quantize_appended(p, p.k_descale, b, h, &r.k_cache[slot * k_slot + at(h) * d], d,
                          token_descales ? &r.k_token_descale[token_at] : nullptr);
        quantize_appended(p, p.v_descale, b, h, &r.v_cache[slot * v_slot + at(h) * dv], dv,
                          token_descales ? &r.v_token_descale[token_at] : nullptr);
      }
      r.appended[slot] = true;
    }
  }

  // Each sequence's keys in order, as a varlen batch.
  ReferenceProblem ref = a;
  std::vector<int> seqlens_q(at(batch), p.seqlen_q), seqlens_k(at(batch));
  std::vector<double> k, v;
  for (int b = 0; b < batch; ++b) {
    seqlens_k[at(b)] = p.seqlens[at(b)] + (append ? p.seqlen_new : 0);
    for (int j = 0; j < seqlens_k[at(b)]; ++j) {
      const auto slot = at(p.cache.slot(b, j));
      k.insert(k.end(), &r.k_cache[slot * k_slot], &r.k_cache[(slot + 1) * k_slot]);
      v.insert(v.end(), &r.v_cache[slot * v_slot], &r.v_cache[(slot + 1) * v_slot]);
    }
  }
  ref.set_lengths(seqlens_q, seqlens_k);
  ref.seqused_k.clear();
  std::vector<double> q = in.q;
  for (int b = 0; p.rotary_dim > 0 && b < batch; ++b) {
    for (int i = 0; i < p.seqlen_q; ++i) {
      const int position = p.seqlens[at(b)] + (p.rotary_q_per_token() ? i : 0);
      for (std::size_t h = 0; h < heads; ++h) {
        rotate(p, &q[(at(std::int64_t{b} * p.seqlen_q + i) * heads + h) * d], position);
      }
    }
  }
  r.attention = attention_reference(ref, q, k, v);
  if (token_descales) {
    // The plain baseline over values dequantized by descales per token: the same computation on
    // the values rounded to q's dtype, as the kernel rounds them (and as a caller dequantizing
    // the cache would). Keys stay exact, as the kernel's are.
    for (double& x : v) x = round_to(a.dtype, x);
    r.attention.out_plain = attention_reference(ref, q, k, v).out_plain;
  }

  const auto total_q = at(std::int64_t{batch} * p.seqlen_q), seqlen_q = at(p.seqlen_q);
  r.lse.resize(r.attention.lse.size());
  for (std::size_t token = 0; token < total_q; ++token) {
    for (std::size_t h = 0; h < heads; ++h) {
      r.lse[(token / seqlen_q * heads + h) * seqlen_q + token % seqlen_q] =
          r.attention.lse[h * total_q + token];
    }
  }
  return r;
}

ReferenceResult merge_reference(DType out_dtype, int tokens, int states, int heads, int dim,
                                const std::vector<double>& v, const std::vector<double>& lse) {
  const auto t_n = at(tokens), s_n = at(states), h_n = at(heads), d = at(dim);
  if (v.size() != t_n * s_n * h_n * d || lse.size() != t_n * s_n * h_n) {
    throw std::invalid_argument("merge_reference: v or lse does not match the shape");
  }
  const double inf = std::numeric_limits<double>::infinity();
  ReferenceResult r;
  r.out.assign(t_n * h_n * d, 0.0);
  r.out_plain.assign(r.out.size(), 0.0);
  r.lse.assign(t_n * h_n, -inf);
  for (std::size_t t = 0; t < t_n; ++t) {
    for (std::size_t h = 0; h < h_n; ++h) {
      const auto state_lse = [&](std::size_t s) { return lse[(t * s_n + s) * h_n + h]; };
      double max = -inf;
      for (std::size_t s = 0; s < s_n; ++s) max = std::max(max, state_lse(s));
      if (max == -inf) continue;  // no keys anywhere: out 0, lse -inf, as initialised
      double sum = 0;
      for (std::size_t s = 0; s < s_n; ++s) sum += std::exp(state_lse(s) - max);
      const double total = max + std::log(sum);
      r.lse[h * t_n + t] = total;
      double* o = &r.out[(t * h_n + h) * d];
      for (std::size_t s = 0; s < s_n; ++s) {
        const double weight = std::exp(state_lse(s) - total);
        const double* vs = &v[((t * s_n + s) * h_n + h) * d];
        for (std::size_t c = 0; c < d; ++c) o[c] += weight * vs[c];
      }
      for (std::size_t c = 0; c < d; ++c)
        r.out_plain[(t * h_n + h) * d + c] = round_to(out_dtype, o[c]);
    }
  }
  return r;
}

}  // namespace kiln::test
