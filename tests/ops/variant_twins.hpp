// SPDX-License-Identifier: Apache-2.0
// The user variants the [gpu] tests run (examples/variants.hpp, and one of the tests' own), each
// with random inputs on the device and its twin in the fp64 reference, for attention and decode
// alike.
#pragma once

#include <memory>
#include <random>
#include <string_view>
#include <vector>

#include "attention_reference.hpp"
#include "gpu.hpp"
#include "kiln/score.hpp"

namespace kiln::test {

enum class UserVariant {
  none,
  alibi,          // ALiBi per head (logit hook)
  document,       // a document mask from segment ids per key position (logit hook)
  relative_bias,  // a relative position bias table (logit hook)
  t5_bias,        // T5's bucketed relative bias (logit hook)
  key_padding,    // a key padding mask, int64 (batch, seqlen_k) (mask hook)
  softmax_one,    // softmax1: a zero sink logit in every row (sink hook)
  row_sinks,      // a sink per (batch, head, query row), with the head's (sink hook)
  gated_cap,      // a tanh cap of the logit times query and key gains (logit and logit_grad)
};

std::string_view to_string(UserVariant variant);

// gated_cap's code: cap * tanh(gain * logit / cap), cap = variant_tensors[0][head] (fp32, heads)
// and gain = variant_tensors[1][batch][query] * variant_tensors[2][batch][key] (fp32, (batch,
// seqlen_q) and (batch, seqlen_k)), with its logit_grad; the cap and the query's gain are the
// row's state.
const Variant& gated_cap_variant();

// The sequences a variant's tensors cover: each of `batch` has up to `seqlen_q` query rows and
// `seqlen_k` keys, and its diagonal's offset (query row i sits at key position i + offset[b]).
struct VariantShape {
  int batch = 0;
  int heads = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  std::vector<int> offsets;  // batch entries
};

// Sets `score`'s variant, scalars and tensors for `variant` over `shape`, with random inputs
// uploaded into `buffers`, and `ref`'s twin of it (alibi_slopes, bias or row_sink; none of them
// may be set already).
void add_user_variant(UserVariant variant, const VariantShape& shape, ReferenceProblem& ref,
                      ScoreOptions& score, std::vector<std::unique_ptr<DeviceBuffer>>& buffers,
                      std::mt19937& rng);

}  // namespace kiln::test
