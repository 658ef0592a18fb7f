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
  // (total_q, heads): the rows that attend no key (the band or the bias left none), whose dq is
  // exactly 0 however it is computed.
  std::vector<bool> keyless;
};

// The gradients of loss = sum(out * dout) with respect to q, k, v and the sinks, with out the
// output of attention_reference(problem, q, k, v) and dout laid out as out (total_q, heads,
// head_dim_v). ALiBi slopes, the bias and the logit hook's inputs get none (kiln computes none);
// rows that attend no key get zero gradients.
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

}  // namespace kiln::test
