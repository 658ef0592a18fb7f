// SPDX-License-Identifier: Apache-2.0
// kiln::attention_backward(): the gradients of kiln::attention() with respect to q, k and v (and
// the sinks), from the forward's output and LSE, compiled per problem like the forward.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/attention.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"
#include "kiln/tensor.hpp"

namespace kiln {

// What the backward computes besides dq, dk and dv. Semantics are FlashAttention's.
struct AttentionGradOptions {
  // Bitwise the same gradients from run to run (and across streams). The default, false, lets a
  // kernel accumulate in an order that may differ between runs (the wgmma kernel's dq).
  bool deterministic = false;

  // Output: fp32 (heads), the gradient of ScoreOptions::sinks, summed over batch and rows.
  // Only with sinks in the forward's options.
  std::optional<TensorView> dsinks;

  // Output: the gradient of AttentionOptions::bias, dL / d logit (the bias joins each logit
  // after the softcap; 0 where the band masks), with the bias's shape and dtype. Where the bias
  // has size 1 in batch or heads (broadcast by size), dbias sums over that dim, as autograd's
  // gradient of a broadcast tensor does; every element of a bias that broadcasts by stride 0
  // gets its own (batch, head)'s gradient, as any element of a view does (autograd's expand
  // then sums them). Only with a bias in the forward's options.
  std::optional<TensorView> dbias;
};

// The backward's problem: the forward's, and the gradients it writes beyond dq, dk and dv.
struct AttentionBackwardProblem {
  AttentionProblem forward;
  bool deterministic = false;
  bool dsinks = false;
  bool dbias = false;
};

// The backward kernels attention_backward() can run. portable and mma have no atomics, so they
// are deterministic; wgmma adds dq up in fp32 with atomic reductions, in a fixed order (each key
// block waiting for its turn) when deterministic.
enum class AttentionBackwardKernel {
  portable,  // attention/backward/backward_portable.cuh: plain loads and fp32 arithmetic, no
             // inline assembly; every target attention runs on
  mma,       // attention/backward/backward_mma.cuh: FlashAttention-2's on tensor cores
             // (mma.sync); NVIDIA sm_80 and newer
  wgmma,     // attention/backward/backward_wgmma.cuh: on Hopper's warpgroup MMA; sm_90a
};

// How it runs. Every config gives results within the same tolerance.
//   portable: the dk/dv kernel takes block_n keys per CTA and stages block_m query rows at a
//   time; the dq kernel takes block_m query rows per CTA and stages block_n keys at a time. Each
//   CTA has warps * 32 threads, which split a key (dk/dv) or query row (dq) between
//   warps * 32 / block_n (or / block_m) lanes.
//   mma: each kernel's CTA holds block_n rows (keys for dk/dv, query rows for dq; a multiple of
//   16) and streams block_m rows of the other side at a time (a multiple of 16, at most
//   warps * 32). Its warps * 32 threads make block_n / 16 row groups of 16 rows, whose
//   warps / (block_n / 16) warps (warps a multiple of block_n / 16) each take a slice of the
//   head dims.
//   wgmma: the dk/dv kernel's CTA holds block_n keys (64 or 128), a warpgroup (warps =
//   block_n / 16) per 64, for head dims up to 128; or, with warps 8 over block_n 64, two
//   warpgroups that split the head dims, up to 256. It streams block_m query rows (64 or 128, at
//   most block_n; 64 where the head dims are split); dq is
//   accumulated in fp32 scratch (seqlen_q * heads * batch * head_dim words, and
//   with deterministic an int per block_m rows of each batch and head, the additions' turns) and
//   converted by a second kernel of block_m rows a CTA.
struct AttentionBackwardConfig {
  int block_m = 32;
  int block_n = 32;
  int warps = 8;
  AttentionBackwardKernel kernel = AttentionBackwardKernel::portable;
};

// The config attention_backward() and warm-up use for `problem` on `target`: the wgmma kernels on
// sm_90a, else the mma kernels on NVIDIA sm_80 and newer, the portable ones on AMD gfx9. Throws
// kiln::Error (unsupported) for any other target.
AttentionBackwardConfig choose(const AttentionBackwardProblem& problem, const Target& target);

// The kernels one backward call launches, in order: the row-dot pre-pass (D = rowsum(dO * O)),
// the sinks' reduction when problem.dsinks, the dk/dv kernel, the dq kernel, and the bias's
// gradient's sum when problem.dbias.
std::vector<KernelSpec> attention_backward_specs(const AttentionBackwardProblem& problem,
                                                 const AttentionBackwardConfig& config);

// Computes dq, dk and dv of out = attention(q, k, v, options) on `stream`, given dout (the
// gradient of out) and the forward's LSE in options.lse: pass the forward's options as they
// were, its lse included. Layouts are the forward's: dout like out; dq, dk and dv like q, k and
// v, with their dtypes; under GQA/MQA dk and dv sum over the query heads of each group. Rows
// that attend no key get zero gradients. Scratch (fp32, about seqlen_q * heads * batch words,
// times head_dim with the wgmma kernels) comes from the runtime's stream-ordered allocator;
// nothing grows with seqlen_q * seqlen_k, except with grads.dbias, itself that large: batch *
// heads * seqlen_q * seqlen_k fp32 words more, dL / d logit before dbias's sum and rounding.
// Throws kiln::Error naming the tensor, the values and the fix for any input it cannot take;
// never launches on bad input. A user variant's logit hook needs its derivative (logit_grad, or
// logit_is_additive: kiln/variant.hpp): without one its kernels fail to compile (a compile
// error naming logit_grad), as do dsinks through a sink hook and dbias under a logit_grad.
// Variant tensors get no gradient.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const AttentionGradOptions& grads = {}, void* stream = nullptr,
                        Runtime& runtime = default_runtime());

// As above, with `config` instead of choose()'s: to test or tune one.
void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& dq,
                        const TensorView& dk, const TensorView& dv, const AttentionOptions& options,
                        const AttentionGradOptions& grads, const AttentionBackwardConfig& config,
                        void* stream = nullptr, Runtime& runtime = default_runtime());

// The specs `kiln warm` compiles by default for the backward on `target`: bf16 and fp16, head
// dims 64, 128 and 256, with and without a mask; none for targets attention does not run on.
std::vector<KernelSpec> attention_backward_default_specs(const Target& target);

}  // namespace kiln
