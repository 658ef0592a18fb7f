// SPDX-License-Identifier: Apache-2.0
// The CPU attention reference the attention tests compare kiln against, with host images of the
// 16-bit device formats and strided host layouts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/spec.hpp"

namespace kiln::test {

// Host images of f16, bf16 and fp8 (e4m3, e5m2: the code in the low byte): the stored bits and
// the value they hold, exactly.
std::uint16_t to_bits(DType dtype, double value);  // round to nearest even
double from_bits(DType dtype, std::uint16_t bits);
double round_to(DType dtype, double value);  // what storing `value` in `dtype` keeps; f32 too
double fp8_largest(DType dtype);             // e4m3's or e5m2's largest finite value: 448, 57344

// `count` values drawn from a normal distribution (std 1), rounded to `dtype` so that host and
// device see the same numbers.
std::vector<double> random_normal(DType dtype, std::size_t count, std::mt19937& rng);

// Sink logits for `heads` query heads of rows over about `keys` keys, as fp32 values: around
// ln(keys), so that each weighs like a good share of a row's keys, from below to above the
// keys' sum; with 3 heads or more the last one is -inf (no sink for that head).
std::vector<double> random_sinks(int heads, int keys, std::mt19937& rng);

// Where the elements of a logical row-major tensor of `shape` live in a larger flat buffer:
// element (i0, i1, ...) at offset + i0 * strides[0] + i1 * strides[1] + ...
struct Strided {
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::int64_t offset = 0;

  std::int64_t count() const;   // elements of the logical tensor
  std::int64_t extent() const;  // one past the furthest element, from the buffer's start
  static Strided dense(std::vector<std::int64_t> shape);  // row-major, offset 0
};

// Calls fn(logical index, buffer position) for every element, in row-major logical order.
void for_each_element(const Strided& layout,
                      const std::function<void(std::int64_t, std::int64_t)>& fn);

// Writes the logical `values` into `buffer` at the layout's positions; the rest is untouched.
void scatter(DType dtype, const Strided& layout, const std::vector<double>& values,
             std::vector<std::uint16_t>& buffer);
// Reads the logical tensor back out of `buffer`.
std::vector<double> gather(DType dtype, const Strided& layout,
                           const std::vector<std::uint16_t>& buffer);

// One attention call as the reference sees it. Every batch is a sequence of tokens in a token
// dim, as varlen lays it out; a padded batch is the case cu_seqlens = {0, s, 2s, ...}.
//   q (total_q, heads, head_dim), k (total_k, heads_kv, head_dim),
//   v (total_k, heads_kv, head_dim_v), dense row-major, values exactly representable in dtype.
struct ReferenceProblem {
  DType dtype = DType::bf16;  // of the inputs; the plain-dtype baseline rounds to it
  // The all-fp8 forward's: the plain baseline rounds each row's probabilities to this fp8 dtype
  // from 2^8 (the largest 256) instead of rounding the normalized ones to dtype, as the kernel's
  // fp8 P operand does.
  std::optional<DType> p_fp8;
  int heads = 1;
  int heads_kv = 1;
  int head_dim = 0;
  int head_dim_v = 0;
  std::vector<int> cu_seqlens_q;  // batch + 1 offsets into the token dim
  std::vector<int> cu_seqlens_k;
  std::vector<int> seqused_k;  // empty, or per batch: only the first seqused_k[b] keys count
  double softmax_scale = 1;
  // The band of keys query i sees, measured from its diagonal i + offset, with offset
  // seqlen_k - seqlen_q (bottom-right) or 0 (top_left); -1 is unbounded. Causal is (-1, 0).
  int window_left = -1;
  int window_right = -1;
  bool top_left = false;
  double softcap = 0;                // > 0: logits = softcap * tanh(logits / softcap)
  std::vector<double> alibi_slopes;  // empty, (heads) or (batch, heads)
  // Per query head (empty: none): a logit that joins each row's softmax denominator with no
  // value, counted in the LSE; a row that sees no key gets out 0 and lse = sink.
  std::vector<double> sinks;
  // A row's own sink logit at (batch, head, query row within the sequence), given the head's
  // (-inf without sinks); empty: the head's. A user variant's sink hook.
  std::function<double(int, int, int, double)> row_sink;
  // Additive bias at (batch, head, query row, key) within the sequence; empty: none.
  std::function<double(int, int, int, int)> bias;
  // A user variant's logit hook at (batch, head, query row, key) within the sequence, given the
  // logit after the bias, and its derivative in that logit (the backward's); empty: none.
  std::function<double(int, int, int, int, double)> logit;
  std::function<double(int, int, int, int, double)> logit_grad;

  int batch() const { return static_cast<int>(cu_seqlens_q.size()) - 1; }
  // A padded batch of `batch` sequences of equal lengths.
  void set_padded(int batch, int seqlen_q, int seqlen_k);
  // Varlen sequences of the given lengths.
  void set_lengths(const std::vector<int>& seqlens_q, const std::vector<int>& seqlens_k);
};

struct ReferenceResult {
  std::vector<double> out;        // (total_q, heads, head_dim_v), in fp64
  std::vector<double> out_plain;  // the same computed plainly in the input dtype (see .cpp)
  std::vector<double> lse;        // (heads, total_q), natural log; -inf for fully masked rows
};

ReferenceResult attention_reference(const ReferenceProblem& problem, const std::vector<double>& q,
                                    const std::vector<double>& k, const std::vector<double>& v);

// The softmax of one query row of one head, as attention_reference computes it in fp64 and
// plainly in the input dtype: what its output and the backward reference are made of.
struct SoftmaxRow {
  int batch = 0;
  int head = 0;
  int head_kv = 0;
  int token = 0;      // the query's token in q
  int first_key = 0;  // the token in k of the first key the row sees
  double lse = 0;     // natural log; without a key, the sink's logit (-inf without a sink)
  // Per key the row sees, from first_key on; empty for a row the band leaves without keys, 0
  // where the bias masked every key and there is no sink.
  std::vector<double> p, p_plain;  // softmax weights; p_plain rounded to the dtype
  // d logit / d (scale * q.k): 1 - tanh^2 under softcap (in fp64, and of the plain logit), else 1.
  std::vector<double> dtanh, dtanh_plain;
  // d logit / d the logit the logit hook was given (the bias's gradient's factor): its
  // logit_grad, 1 without a hook.
  std::vector<double> dhook, dhook_plain;
  double sink_p = 0, sink_p_plain = 0;  // the sink's softmax weight
};

// Calls fn for each (batch, head, query row) of `problem`, with q and k as attention_reference
// takes them (it checks their sizes; this does not).
void for_each_softmax_row(const ReferenceProblem& problem, const std::vector<double>& q,
                          const std::vector<double>& k,
                          const std::function<void(const SoftmaxRow&)>& fn);

// FlashAttention's acceptance rule: kiln's largest error against the fp64 reference may be at
// most twice the largest error of the plain-dtype computation, plus 1e-5.
struct ErrorReport {
  double max_error = 0;         // of the finite outputs against the fp64 reference
  double baseline_error = 0;    // of the plain-dtype output against the fp64 reference
  std::int64_t worst = -1;      // index of max_error's element
  std::int64_t not_finite = 0;  // NaN or inf (the reference is always finite)
  std::int64_t first_not_finite = -1;
  double bound() const { return 2 * baseline_error + 1e-5; }
  bool ok() const { return not_finite == 0 && max_error <= bound(); }
};
// `got` against the fp64 `want`, with `plain` (the same computed plainly in the input dtype) as
// the baseline: for out and for each gradient.
ErrorReport compare_values(const std::vector<double>& got, const std::vector<double>& want,
                           const std::vector<double>& plain);
ErrorReport compare_output(const std::vector<double>& got, const ReferenceResult& ref);
// The report in words, with the worst element's (token, head, column) for values laid out
// (tokens, heads, dim), as the reference's out (dim_v) and gradients are.
std::string explain(const ErrorReport& report, const std::vector<double>& got,
                    const std::vector<double>& want, const std::vector<double>& plain, int heads,
                    int dim);
std::string explain(const ErrorReport& report, const std::vector<double>& got,
                    const ReferenceResult& ref, int heads, int dim_v);

// LSE within 1e-3, relative above magnitude 1; -inf exactly where the reference has -inf.
struct LseReport {
  std::int64_t bad = 0;
  std::int64_t first_bad = -1;
  bool ok() const { return bad == 0; }
};
LseReport compare_lse(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace kiln::test
