// SPDX-License-Identifier: Apache-2.0
// The CPU reference of attention's backward pass the backward tests compare kiln against: the
// gradients of attention_reference's output in fp64, and the same computed plainly in the input
// dtype, the baseline of FlashAttention's backward rule.
#pragma once

#include <span>
#include <vector>

#include "attention_reference.hpp"

namespace kiln::test {

// One gradient in fp64, and the same computed plainly in the input dtype (see the .cpp); compare
// kiln's with compare_values(got, exact, plain): FlashAttention's backward rule is the forward's.
struct GradientReference {
  std::vector<double> exact;
  std::vector<double> plain;
};

struct BackwardReference {
  ReferenceResult forward;  // attention_reference of the same inputs
  GradientReference dq;     // (total_q, heads, head_dim)
  GradientReference dk;     // (total_k, heads_kv, head_dim), summed over each group's query heads
  GradientReference dv;     // (total_k, heads_kv, head_dim_v), the same
  // (heads), summed over batch and rows, the plain one in fp32; empty without sinks.
  GradientReference dsinks;
  // The bias's gradient dL / d logit, (batch, heads, seqlen_q, seqlen_k) with the longest
  // sequences' lengths (keys as cu_seqlens_k counts them), 0 past a sequence's own and outside
  // its band; empty without a bias. reduce_dbias sums it as a bias of size 1 needs.
  GradientReference dbias;
  // (total_q, heads): the rows that attend no key (the band or the bias left none), whose dq is
  // exactly 0 however it is computed.
  std::vector<bool> keyless;
};

// The layout of the full bias gradient (BackwardReference::dbias), or of one reduced over the
// batch or heads (batch or heads 1): (batch, heads, seqlen_q, seqlen_k), row-major.
struct BiasShape {
  std::size_t batch = 0, heads = 0, seqlen_q = 0, seqlen_k = 0;

  std::size_t count() const { return batch * heads * seqlen_q * seqlen_k; }
  std::size_t at(std::size_t b, std::size_t h, std::size_t i, std::size_t j) const {
    return ((b * heads + h) * seqlen_q + i) * seqlen_k + j;
  }
};

// The full one of `problem`: its batch and heads, and its longest sequences' lengths.
BiasShape bias_shape(const ReferenceProblem& problem);

// The gradients of loss = sum(out * dout) with respect to q, k, v and the sinks, with out the
// output of attention_reference(problem, q, k, v) and dout laid out as out (total_q, heads,
// head_dim_v), and with respect to the bias; ALiBi slopes and the logit hook's inputs get none
// (kiln computes none); rows that attend no key get zero gradients.
//
// stored_out, when given, is the out the backward under test reads (the forward kernel's, laid
// out as out): the plain dsinks takes its row sums D from it. dsinks is one sum over all of a
// head's rows, and the rounding of out moves it by about its whole error budget, in a direction
// that is a coin toss: a plain baseline with an out of its own would pass or fail by luck.
BackwardReference attention_backward_reference(const ReferenceProblem& problem,
                                               const std::vector<double>& q,
                                               const std::vector<double>& k,
                                               const std::vector<double>& v,
                                               const std::vector<double>& dout,
                                               std::span<const double> stored_out = {});

// The gradient of a bias that broadcasts over the batch (over_batch) or the heads (over_heads) by
// size 1, from the full one (BackwardReference::dbias, of `problem`): sums over those dims, of
// size 1 in the result; the plain one rounds its sum of plain elements to the dtype once, as
// autograd's sum of a broadcast tensor's gradient does.
GradientReference reduce_dbias(const ReferenceProblem& problem, const GradientReference& dbias,
                               bool over_batch, bool over_heads);

}  // namespace kiln::test
