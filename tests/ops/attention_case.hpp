// SPDX-License-Identifier: Apache-2.0
// One attention [gpu] case, as the forward and backward tests run it: the call it makes (sizes,
// layouts, score model, bias, varlen), its random inputs on the device in their layouts with
// poisoned outputs, and the fp64 reference's problem of the same inputs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "gpu.hpp"
#include "gpu_harness.hpp"
#include "kiln/attention.hpp"

namespace kiln::test {

enum class Layout {
  contiguous,  // (batch, seqlen, heads, d), or (tokens, heads, d) with varlen
  padded,      // every stride padded (lse's too), the gaps NaN, views 16 bytes into the buffer
  packed_qkv,  // q, k, v slices of one (batch, seqlen, 3, heads, d) buffer
  bhsd,        // (batch, heads, seqlen, d) memory, or (heads, tokens, d), seen through strides
};
// batch_broadcast and head_broadcast broadcast by stride 0; the *_size_one ones by size 1.
enum class Bias {
  none,
  full,
  batch_broadcast,
  head_broadcast,
  transposed,
  batch_size_one,
  heads_size_one
};

struct Case {
  DType dtype = DType::bf16;
  int batch = 1;
  int seqlen_q = 1;
  int seqlen_k = 1;
  int heads = 1;
  int heads_kv = 1;
  int head_dim = 64;
  int head_dim_v = 0;  // 0: head_dim
  ScoreCase score;
  Layout layout = Layout::contiguous;
  Bias bias = Bias::none;
  bool lse = false;
  std::vector<int> seqlens_q;  // varlen when set: one length per sequence
  std::vector<int> seqlens_k;
  std::vector<int> seqused_k;
  // k and v stored in fp8 (e4m3 or e5m2) under q's 16-bit dtype: normal values rounded to it,
  // with FlashAttention-3's descales (random, one per sequence and kv head) or without. The
  // reference attends the stored values times the descales.
  std::optional<DType> kv_fp8;
  bool descales = false;
  // q in kv_fp8 too (the all-fp8 forward), out in dtype; with descales, q's too (q_descale).
  bool q_fp8 = false;

  bool varlen() const { return !seqlens_q.empty(); }
  DType kv_dtype() const { return kv_fp8.value_or(dtype); }
  DType q_dtype() const { return q_fp8 ? kv_dtype() : dtype; }
  int dim_v() const { return head_dim_v ? head_dim_v : head_dim; }
};

// The case in words.
std::string describe(const Case& c);

// Where each tensor of `c` lives in its buffer.
struct Layouts {
  Strided q, k, v, out, lse;
};

Layouts layouts_of(const Case& c, const ReferenceProblem& ref);

// Everything on the device for one case, and the views and options that point into it.
struct DeviceCase {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;  // inputs, kept alive
  TensorView q, k, v;
  std::unique_ptr<Output> out, lse;
  kiln::AttentionOptions options;
};

// A case on the device: fresh random inputs in their layouts, poisoned outputs, and the fp64
// reference of the same inputs.
struct Prepared {
  DeviceCase d;
  ReferenceResult want;
  bool has_rows = false;  // some query row to compute
  // The reference's problem and inputs, for other references of the same case.
  ReferenceProblem ref;
  std::vector<double> q, k, v;
};

Prepared prepare(const Case& c, std::mt19937& rng);

}  // namespace kiln::test
