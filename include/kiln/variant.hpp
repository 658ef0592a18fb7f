// SPDX-License-Identifier: Apache-2.0
// kiln::Variant: attention written by its user. Device code, compiled into the call's kernels at
// run time, that turns each logit into the one the softmax sees (a bias, a position encoding),
// masks keys, or gives each row a sink: any function of the coordinates and of the variant's
// runtime scalars and tensors (ScoreOptions::variant_scalars, variant_tensors).
#pragma once

#include <string>

namespace kiln {

// The code defines one struct, kiln_variant, with any of three hooks (at least one):
//
//   struct kiln_variant {
//     static __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
//                                   float logit);
//     static __device__ bool mask(const kiln::VariantParams& v, const kiln::VariantCoords& at);
//     static __device__ float sink(const kiln::VariantParams& v, const kiln::VariantCoords& at,
//                                  float sink);
//   };
//
// - logit takes each logit after kiln's own score model (scale, softcap, ALiBi, bias) and before
//   the band mask and the softmax, and returns the new one; -inf masks the key out.
// - mask says whether the query at `at` sees the key at `at` (false masks it, as FlexAttention's
//   mask_mod); it applies after logit.
// - sink takes each row's sink logit (ScoreOptions::sinks[head], natural units, or -inf without
//   sinks) and returns the row's own: a logit that joins the row's softmax denominator with no
//   value. at.key is -1 there.
//
// The backward (kiln/attention_backward.hpp) needs logit's derivative in the logit it is given.
// A logit that only adds a function of the coordinates (-inf masking) says so:
//
//     static constexpr bool logit_is_additive = true;  // d logit / d x is 1
//
// any other gives it as a fourth hook, called where logit is, with the same arguments:
//
//     static __device__ float logit_grad(const kiln::VariantParams& v,
//                                        const kiln::VariantCoords& at, float logit);
//
// The backward of a variant whose logit has neither fails to compile, naming logit_grad. mask
// needs nothing, nor does sink for dq, dk and dv; dsinks through a sink hook is refused.
// Variant scalars and tensors get no gradient.
//
// What a row's logits share can be worked out once per row: give kiln_variant data members and
//
//     static __device__ kiln_variant row(const kiln::VariantParams& v,
//                                        const kiln::VariantCoords& at);  // at.key is -1
//
// and make the hooks const members, which are then called on the row's kiln_variant (ALiBi's
// slope, a query's document id: examples/variants.hpp). Without `row`, kiln_variant{} is used, so
// it may then hold no data. A compile error says so, and names a hook or `row` of another shape
// (a non-const member hook, say) rather than skip it.
//
// v.scalars[i] and v.tensors[i] (kiln::variant_load<T>(v.tensors[i], i0, ...)) are the call's
// ScoreOptions::variant_scalars and variant_tensors; `at` holds the batch, query head, kv head,
// query row and key index, and the diagonal's offset: query row i sits at key position
// i + offset (kiln/params/score.h). The hooks run in every attention kernel, prefill, decode
// and backward. `row` and `sink` are given rows inside the sequence. `logit`, `logit_grad` and
// `mask` are given each logit's exact coordinates, also where a tile overhangs the sequence (or
// the backward's is masked): there at.query may be past the last query or at.key past the last
// key, and what they return is discarded. variant_load
// clamps each index into its dimension, so a read at such coordinates stays inside the tensor:
// read tensors through it, never through their data pointers.
//
// The code is part of each kernel's generated unit, so it is part of the cache key: changing it
// compiles new kernels, changing a scalar or a tensor does not. A compile error in it names the
// file "variant NAME" and the line within `code`. Its macros would reach the kernels compiled
// after it, so it may #define and #undef only names of its own: not a keyword (static_assert),
// a name reserved to the implementation (__syncthreads, _X) or one of kiln's (kiln..., KILN...);
// a NUL byte in it, where the compiler would take it to end, is refused too.
struct Variant {
  std::string name;  // a C++ identifier: names the variant in kernel specs and compile errors
  std::string code;
};

}  // namespace kiln
