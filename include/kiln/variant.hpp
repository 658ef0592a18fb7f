// kiln::Variant: attention written by its user. Device code, compiled into the call's kernels at
// run time, that turns each logit into the one the softmax sees: a bias, a mask (return -inf),
// a position encoding, any function of the logit's coordinates and of the variant's runtime
// scalars and tensors (ScoreOptions::variant_scalars, variant_tensors).
#pragma once

#include <string>

namespace kiln {

// The code defines one struct, kiln_variant, with the hook
//
//   struct kiln_variant {
//     static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
//                                   float logit);
//   };
//
// which takes each logit after kiln's own score model (scale, softcap, ALiBi, bias) and before
// the band mask and the softmax, and returns the new one; -inf masks the key out for that query.
// v.scalars[i] and v.tensors[i] (kiln::variant_load<T>(v.tensors[i], i0, ...)) are the call's
// ScoreOptions::variant_scalars and variant_tensors; `at` holds the batch, query head, kv head,
// query row and key index, and the diagonal's offset: query row i sits at key position
// i + offset (kiln/params/score.h). The hook runs in every attention kernel, prefill
// and decode, only on logits of real (query, key) pairs, so it may index tensors by them.
//
// The code is part of each kernel's generated unit, so it is part of the cache key: changing it
// compiles new kernels, changing a scalar or a tensor does not. A compile error in it names the
// file "variant NAME" and the line within `code`.
struct Variant {
  std::string name;  // a C++ identifier: names the variant in kernel specs and compile errors
  std::string code;
};

}  // namespace kiln
