// SPDX-License-Identifier: Apache-2.0
// Attention variants written by their user (kiln/variant.hpp), as examples: ALiBi, a document
// mask, a relative position bias table and T5's bucketed relative bias (logit hooks that add to
// the logit, so declared logit_is_additive for the backward), a key padding mask (a mask hook)
// and softmax1 (a sink hook). tests/ops/attention_compile_test.cpp
// compiles each into every attention kernel; the [gpu] tests run them against the fp64
// reference (tests/ops/attention_test.cpp, decode_test.cpp).
#pragma once

#include "kiln/variant.hpp"

namespace kiln::examples {

// ALiBi written as a variant: logit -= slope[head] * |query + offset - key|, as the built-in
// measures it from the diagonal, with variant_tensors[0] the fp32 slopes (heads). The slope is
// the row's state: `row` reads it once per row, not once per logit.
inline const Variant& alibi_variant() {
  static const Variant variant{.name = "alibi", .code = R"(
struct kiln_variant {
  static constexpr bool logit_is_additive = true;  // for the backward
  float slope;
  static __device__ kiln_variant row(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return {kiln::variant_load<float>(v.tensors[0], at.head)};
  }
  __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords& at,
                         float logit) const {
    return logit - slope * static_cast<float>(abs(at.query + at.offset - at.key));
  }
};
)"};
  return variant;
}

// A document mask: a query sees a key only within its own segment, variant_tensors[0] the int32
// segment id of each key position (batch, seqlen_k); the query of row i is at position
// i + offset (the last seqlen_q positions, bottom-right). The query's segment is the row's state.
inline const Variant& document_variant() {
  static const Variant variant{.name = "document", .code = R"(
struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  int query_doc;
  static __device__ kiln_variant row(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return {kiln::variant_load<int>(v.tensors[0], at.batch, at.query + at.offset)};
  }
  __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                         float logit) const {
    const int key_doc = kiln::variant_load<int>(v.tensors[0], at.batch, at.key);
    return query_doc == key_doc ? logit : -__int_as_float(0x7f800000);
  }
};
)"};
  return variant;
}

// A learned relative position bias, one per head and clamped distance: logit +=
// table[head][clamp(key - position, -max, max) + max], position = query + offset (the query's
// place among the keys), variant_tensors[0] the fp32 table
// (heads, 2 * max + 1) and variant_scalars[0] max (a whole number).
inline const Variant& relative_bias_variant() {
  static const Variant variant{.name = "relative_bias", .code = R"(
struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                                float logit) {
    const int most = static_cast<int>(v.scalars[0]);
    const int distance = min(max(at.key - (at.query + at.offset), -most), most);
    return logit + kiln::variant_load<float>(v.tensors[0], at.head, distance + most);
  }
};
)"};
  return variant;
}

// T5's relative attention bias: the distance key - (query + offset) falls in one of `buckets`
// buckets
// (half for each direction when bidirectional: exact up to buckets / 4, then logarithmic up to
// max_distance), and logit += table[bucket][head]. variant_tensors[0] is the fp32 table
// (buckets, heads); scalars: [0] buckets, [1] max_distance, [2] 1 when bidirectional.
inline const Variant& t5_bias_variant() {
  static const Variant variant{.name = "t5_bias", .code = R"(
struct kiln_variant {
  static constexpr bool logit_is_additive = true;
  static __device__ int bucket(int relative, int buckets, int max_distance, bool bidirectional) {
    int base = 0;
    if (bidirectional) {
      buckets /= 2;
      if (relative > 0) base = buckets;
      relative = abs(relative);
    } else {
      relative = -min(relative, 0);
    }
    const int exact = buckets / 2;
    if (relative < exact) return base + relative;
    const int far = exact + static_cast<int>(logf(static_cast<float>(relative) / exact) /
                                             logf(static_cast<float>(max_distance) / exact) *
                                             (buckets - exact));
    return base + min(far, buckets - 1);
  }
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                                float logit) {
    const int b = bucket(at.key - (at.query + at.offset), static_cast<int>(v.scalars[0]),
                         static_cast<int>(v.scalars[1]), v.scalars[2] != 0.f);
    return logit + kiln::variant_load<float>(v.tensors[0], b, at.head);
  }
};
)"};
  return variant;
}

// A key padding mask, as Hugging Face's attention_mask: variant_tensors[0] is int64 (batch,
// seqlen_k), 1 for a key to attend and 0 for padding. A row whose keys are all padding gets out 0
// (and lse -inf, or its sink).
inline const Variant& key_padding_variant() {
  static const Variant variant{.name = "key_padding", .code = R"(
struct kiln_variant {
  static __device__ bool mask(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return kiln::variant_load<long long>(v.tensors[0], at.batch, at.key) != 0;
  }
};
)"};
  return variant;
}

// softmax1 ("attention is off by one"): every row's softmax denominator gains 1, a sink logit of
// 0, so that a head can attend to nothing; with ScoreOptions::sinks the two sinks add up.
inline const Variant& softmax_one_variant() {
  static const Variant variant{.name = "softmax_one", .code = R"(
struct kiln_variant {
  static __device__ float sink(const kiln::VariantParams&, const kiln::VariantCoords&, float sink) {
    return fmaxf(sink, 0.f) + log1pf(expf(-fabsf(sink)));  // log(e^sink + e^0)
  }
};
)"};
  return variant;
}

}  // namespace kiln::examples
