// User variants (kiln/variant.hpp) the attention and decode tests run, each the twin of a
// reference feature so that the fp64 reference checks it.
#pragma once

#include "kiln/variant.hpp"

namespace kiln::test {

// ALiBi written as a variant: logit -= slope[head] * |query + offset[batch] - key|, with
// variant_tensors[0] the fp32 slopes (heads) and [1] the int32 diagonal offsets (batch),
// seqlen_k - seqlen_q of each sequence (bottom-right), as ALiBi's built-in measures it.
inline const Variant& alibi_variant() {
  static const Variant variant{.name = "alibi", .code = R"(
struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                                float logit) {
    const float slope = kiln::variant_load<float>(v.tensors[0], at.head);
    const int offset = kiln::variant_load<int>(v.tensors[1], at.batch);
    return logit - slope * static_cast<float>(abs(at.query + offset - at.key));
  }
};
)"};
  return variant;
}

// A document mask: query i sees key j only within its own segment, variant_tensors[0] the
// int32 segment id of each token (batch, seqlen), queries and keys being the same tokens.
inline const Variant& document_variant() {
  static const Variant variant{.name = "document", .code = R"(
struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                                float logit) {
    const int query_doc = kiln::variant_load<int>(v.tensors[0], at.batch, at.query);
    const int key_doc = kiln::variant_load<int>(v.tensors[0], at.batch, at.key);
    return query_doc == key_doc ? logit : -__int_as_float(0x7f800000);
  }
};
)"};
  return variant;
}

}  // namespace kiln::test
