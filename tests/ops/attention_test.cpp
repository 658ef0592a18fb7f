// SPDX-License-Identifier: Apache-2.0
// kiln::attention() on a GPU against the fp64 CPU reference, every case with both kernels (the
// one choose() picks and the portable one AMD targets run): odd sizes, every head dim, both
// dtypes, masks, GQA, strided layouts, softcap, ALiBi, bias, LSE, varlen and empty problems;
// and, with no GPU, the reference itself against hand-computed cases.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attention_case.hpp"
#include "attention_reference.hpp"
#include "gpu.hpp"
#include "gpu_harness.hpp"
#include "kiln/attention.hpp"
#include "support.hpp"
#include "variant_twins.hpp"

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::test::Alibi;
using kiln::test::Bias;
using kiln::test::Case;
using kiln::test::DeviceBuffer;
using kiln::test::DeviceCase;
using kiln::test::kDTypes;
using kiln::test::Layout;
using kiln::test::Output;
using kiln::test::Prepared;
using kiln::test::ReferenceProblem;
using kiln::test::ReferenceResult;
using kiln::test::Strided;
using kiln::test::upload;
using kiln::test::UserVariant;

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// The reference, checked by hand (no GPU).

// q = (1, 0, ..., 0) against k0 = (ln 3, 0, ...) and k1 = 0 at scale 1: logits ln 3 and 0, so
// the softmax weights are 3/4 and 1/4 and the LSE is ln 4.
struct TwoKeys {
  std::vector<double> q = std::vector<double>(8, 0.0);
  std::vector<double> k = std::vector<double>(16, 0.0);
  std::vector<double> v = std::vector<double>(16, 0.0);
  TwoKeys() {
    q[0] = 1;
    k[0] = std::log(3.0);
    for (std::size_t c = 0; c < 8; ++c) {
      v[c] = static_cast<double>(c) + 1;         // v0 = 1..8
      v[8 + c] = -2.0 * static_cast<double>(c);  // v1 = 0, -2, ..., -14
    }
  }
  static ReferenceProblem problem() {
    ReferenceProblem p;
    p.head_dim = p.head_dim_v = 8;
    p.set_padded(1, 1, 2);
    return p;
  }
  // The output row for softmax weights w0 and 1 - w0.
  std::vector<double> mix(double w0) const {
    std::vector<double> out(8);
    for (std::size_t c = 0; c < 8; ++c) out[c] = w0 * v[c] + (1 - w0) * v[8 + c];
    return out;
  }
};

// Hand-computed values agree with the fp64 reference to rounding.
Approx near(double x) {
  return Approx(x).epsilon(1e-12).margin(1e-12);
}

void check_row(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t c = 0; c < got.size(); ++c) {
    INFO("column " << c);
    CHECK(got[c] == near(want[c]));
  }
}

TEST_CASE("attention reference: one query over two keys, by hand", "[attention]") {
  const TwoKeys in;
  ReferenceProblem p = TwoKeys::problem();
  ReferenceResult r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.75));
  CHECK(r.lse[0] == near(std::log(4.0)));

  // The scale multiplies the logits: ln 3 / 2 and 0 give weights sqrt 3 : 1.
  p.softmax_scale = 0.5;
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(std::sqrt(3.0) / (std::sqrt(3.0) + 1)));
  CHECK(r.lse[0] == near(std::log(std::sqrt(3.0) + 1)));
}

TEST_CASE("attention reference: the band, its alignment and fully masked rows, by hand",
          "[attention]") {
  const TwoKeys in;
  ReferenceProblem p = TwoKeys::problem();
  // Bottom-right causal: the one query is aligned with the last key and sees both.
  p.window_right = 0;
  ReferenceResult r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.75));
  // Top-left causal: it sees key 0 only.
  p.top_left = true;
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(1.0));
  CHECK(r.lse[0] == near(std::log(3.0)));
  // Window (0, 0) bottom-right: key 1 only, logit 0.
  p.top_left = false;
  p.window_left = 0;
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.0));
  CHECK(r.lse[0] == near(0.0));
  // Window (0, 0) top-left with two queries over one key: query 1 has no key at all.
  p.top_left = true;
  p.set_padded(1, 2, 1);
  std::vector<double> q2(16, 0.0);
  q2[0] = 1;
  q2[8] = 1;
  const std::vector<double> k1(in.k.begin(), in.k.begin() + 8);
  const std::vector<double> v1(in.v.begin(), in.v.begin() + 8);
  r = kiln::test::attention_reference(p, q2, k1, v1);
  check_row(std::vector<double>(r.out.begin(), r.out.begin() + 8), in.mix(1.0));
  CHECK(r.lse[0] == near(std::log(3.0)));
  check_row(std::vector<double>(r.out.begin() + 8, r.out.end()), std::vector<double>(8, 0.0));
  check_row(std::vector<double>(r.out_plain.begin() + 8, r.out_plain.end()),
            std::vector<double>(8, 0.0));
  CHECK(r.lse[1] == -kInf);
  // Bottom-right causal with more queries than keys: the first query is fully masked.
  p.top_left = false;
  p.window_left = -1;
  r = kiln::test::attention_reference(p, q2, k1, v1);
  CHECK(r.lse[0] == -kInf);
  check_row(std::vector<double>(r.out.begin(), r.out.begin() + 8), std::vector<double>(8, 0.0));
  check_row(std::vector<double>(r.out.begin() + 8, r.out.end()), in.mix(1.0));
}

TEST_CASE("attention reference: softcap, ALiBi and bias, by hand", "[attention]") {
  const TwoKeys in;
  ReferenceProblem p = TwoKeys::problem();
  // Softcap 1: tanh(ln 3) = 0.8 exactly.
  p.softcap = 1;
  ReferenceResult r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(std::exp(0.8) / (std::exp(0.8) + 1)));
  CHECK(r.lse[0] == near(std::log(std::exp(0.8) + 1)));
  // ALiBi slope ln 3 bottom-right: key 0 is 1 from the diagonal, key 1 on it: equal logits.
  p.softcap = 0;
  p.alibi_slopes = {std::log(3.0)};
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.5));
  // Top-left, key 1 is 1 from the diagonal instead: logits ln 3 and -ln 3, weights 9 : 1.
  p.top_left = true;
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.9));
  // Per (batch, head) slopes, two batches of one head: batch 1 takes the second slope.
  p.top_left = false;
  p.set_padded(2, 1, 2);
  p.alibi_slopes = {0.0, 5.0};
  std::vector<double> q2(in.q), k2(in.k), v2(in.v);
  q2.insert(q2.end(), in.q.begin(), in.q.end());
  k2.insert(k2.end(), in.k.begin(), in.k.end());
  v2.insert(v2.end(), in.v.begin(), in.v.end());
  r = kiln::test::attention_reference(p, q2, k2, v2);
  check_row(std::vector<double>(r.out.begin(), r.out.begin() + 8), in.mix(0.75));
  const double w = 3 * std::exp(-5.0) / (3 * std::exp(-5.0) + 1);
  check_row(std::vector<double>(r.out.begin() + 8, r.out.end()), in.mix(w));
  // Bias adds to the logits: +ln 3 on key 1 evens them out.
  p = TwoKeys::problem();
  const auto on_key = [](double x) {
    return
        [x](int b, int h, int i, int j) { return b == 0 && h == 0 && i == 0 && j == 1 ? x : 0.0; };
  };
  p.bias = on_key(std::log(3.0));
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.5));
  CHECK(r.lse[0] == near(std::log(6.0)));
  // ... after the softcap, which caps ln 3 to 0.8 and leaves the bias of 0.8 alone.
  p.softcap = 1;
  p.bias = on_key(0.8);
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.5));
}

TEST_CASE("attention reference: sinks join the denominator with no value, by hand", "[attention]") {
  const TwoKeys in;
  ReferenceProblem p = TwoKeys::problem();
  // Weights 3 and 1 of the keys and 4 of a sink ln 4: the keys keep 3/8 and 1/8.
  p.sinks = {std::log(4.0)};
  ReferenceResult r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  std::vector<double> want(8);
  for (std::size_t c = 0; c < 8; ++c) want[c] = 3.0 / 8 * in.v[c] + 1.0 / 8 * in.v[8 + c];
  check_row(r.out, want);
  CHECK(r.lse[0] == near(std::log(8.0)));
  // A sink far above the keys takes nearly all the weight, in fp64 as well.
  p.sinks = {50.0};
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  CHECK(r.lse[0] == near(50.0 + std::log1p(4 * std::exp(-50.0))));
  CHECK(std::abs(r.out[0]) < 1e-20);
  // -inf is no sink.
  p.sinks = {-kInf};
  r = kiln::test::attention_reference(p, in.q, in.k, in.v);
  check_row(r.out, in.mix(0.75));
  CHECK(r.lse[0] == near(std::log(4.0)));
  // A row that sees no key: out 0, and lse the sink's (the masked query of a top-left window).
  p.sinks = {0.5};
  p.top_left = true;
  p.window_left = p.window_right = 0;
  p.set_padded(1, 2, 1);
  std::vector<double> q2(16, 0.0);
  q2[0] = 1;
  const std::vector<double> k1(in.k.begin(), in.k.begin() + 8);
  const std::vector<double> v1(in.v.begin(), in.v.begin() + 8);
  r = kiln::test::attention_reference(p, q2, k1, v1);
  CHECK(r.lse[1] == near(0.5));
  check_row(std::vector<double>(r.out.begin() + 8, r.out.end()), std::vector<double>(8, 0.0));
  // Query 0 sees key 0 (logit ln 3, weight 3) beside the sink's e^0.5.
  const double w = 3 / (3 + std::exp(0.5));
  for (std::size_t c = 0; c < 8; ++c) want[c] = w * in.v[c];
  check_row(std::vector<double>(r.out.begin(), r.out.begin() + 8), want);
  CHECK(r.lse[0] == near(std::log(3 + std::exp(0.5))));
}

TEST_CASE("attention reference: GQA heads, varlen offsets and the LSE layout", "[attention]") {
  // 4 query heads on 2 kv heads; kv head 1's values are 10 times kv head 0's. Two sequences of
  // 1 and 2 queries over 2 and 1 keys, bottom-right causal.
  ReferenceProblem p;
  p.heads = 4;
  p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 8;
  p.window_right = 0;
  p.set_lengths({1, 2}, {2, 1});
  std::vector<double> q(3 * 4 * 8, 0.0), k(3 * 2 * 8, 0.0), v(3 * 2 * 8, 0.0);
  for (std::size_t token = 0; token < 3; ++token) {
    for (std::size_t h = 0; h < 2; ++h) {
      for (std::size_t c = 0; c < 8; ++c) {
        v[(token * 2 + h) * 8 + c] = (h == 0 ? 1.0 : 10.0) * static_cast<double>(token + 1);
      }
    }
  }
  const ReferenceResult r = kiln::test::attention_reference(p, q, k, v);
  // All logits 0: sequence 0's query averages keys 0 and 1 (1.5 and 15 by kv head).
  for (std::size_t h = 0; h < 4; ++h) {
    INFO("head " << h);
    CHECK(r.out[h * 8] == near(h < 2 ? 1.5 : 15.0));
    CHECK(r.lse[h * 3] == near(std::log(2.0)));
    // Sequence 1 (tokens 1, 2) has 1 key: its first query is masked, its second sees key 2.
    CHECK(r.lse[h * 3 + 1] == -kInf);
    CHECK(r.out[(1 * 4 + h) * 8] == 0.0);
    CHECK(r.out[(2 * 4 + h) * 8] == near(h < 2 ? 3.0 : 30.0));
    CHECK(r.lse[h * 3 + 2] == near(0.0));
  }
  // seqused_k = 1 for sequence 0 leaves it key 0 only, and moves its diagonal there.
  p.seqused_k = {1, 1};
  const ReferenceResult used = kiln::test::attention_reference(p, q, k, v);
  CHECK(used.out[0] == near(1.0));
  CHECK(used.lse[0] == near(0.0));
}

TEST_CASE("attention reference: 16-bit rounding, layouts and the acceptance rule", "[attention]") {
  using kiln::test::from_bits;
  using kiln::test::round_to;
  using kiln::test::to_bits;
  // Ties go to even: 1 + 2^-8 sits halfway between bf16 1 and 1 + 2^-7.
  CHECK(round_to(DType::bf16, 1 + 0x1p-8) == 1.0);
  CHECK(round_to(DType::bf16, 1 + 3 * 0x1p-8) == 1 + 0x1p-6);
  CHECK(round_to(DType::bf16, 1 + 0x1p-8 + 0x1p-20) == 1 + 0x1p-7);
  CHECK(round_to(DType::f16, 1 + 0x1p-11) == 1.0);
  CHECK(round_to(DType::f16, 1 + 3 * 0x1p-11) == 1 + 0x1p-9);
  CHECK(to_bits(DType::bf16, 1.0) == 0x3f80);
  CHECK(to_bits(DType::f16, -2.0) == 0xc000);
  CHECK(std::isnan(from_bits(DType::bf16, 0xffff)));
  CHECK(std::isnan(from_bits(DType::f16, 0xffff)));

  // Packed (batch 1, seqlen 2, 3, heads 2, d 8): k's slice starts 16 elements in.
  const Strided k_slice{.shape = {1, 2, 2, 8}, .strides = {96, 48, 8, 1}, .offset = 16};
  CHECK(k_slice.count() == 32);
  CHECK(k_slice.extent() == 16 + 48 + 8 + 7 + 1);
  std::vector<double> values(32);
  std::iota(values.begin(), values.end(), 1.0);
  std::vector<std::uint16_t> buffer(96, 0xffff);
  kiln::test::scatter(DType::bf16, k_slice, values, buffer);
  CHECK(from_bits(DType::bf16, buffer[16]) == 1.0);
  CHECK(from_bits(DType::bf16, buffer[16 + 8]) == 9.0);    // head 1
  CHECK(from_bits(DType::bf16, buffer[16 + 48]) == 17.0);  // token 1
  CHECK(buffer[15] == 0xffff);
  CHECK(buffer[32] == 0xffff);  // v's slice of token 0 stays untouched
  CHECK(kiln::test::gather(DType::bf16, k_slice, buffer) == values);

  // The plain-dtype baseline differs from fp64 by rounding, a little: kiln's bound is 2x that.
  std::mt19937 rng(5);
  ReferenceProblem p;
  p.dtype = DType::bf16;
  p.head_dim = p.head_dim_v = 64;
  p.heads = p.heads_kv = 2;
  p.softmax_scale = 0.125;
  p.set_padded(1, 33, 47);
  const auto q = kiln::test::random_normal(DType::bf16, 33 * 2 * 64, rng);
  const auto k = kiln::test::random_normal(DType::bf16, 47 * 2 * 64, rng);
  const auto v = kiln::test::random_normal(DType::bf16, 47 * 2 * 64, rng);
  const auto stored = [](double x) { return x != 0 && round_to(DType::bf16, x) == x; };
  CHECK(std::all_of(q.begin(), q.end(), stored));
  const ReferenceResult r = kiln::test::attention_reference(p, q, k, v);
  CHECK(std::all_of(r.out_plain.begin(), r.out_plain.end(), stored));
  auto report = kiln::test::compare_output(r.out, r);
  CHECK(report.ok());
  CHECK(report.max_error == 0.0);
  CHECK(report.baseline_error > 1e-4);
  CHECK(report.baseline_error < 0.05);
  // An error just over the bound fails, as does a NaN.
  std::vector<double> off = r.out;
  off[100] += 1.01 * report.bound();
  CHECK_FALSE(kiln::test::compare_output(off, r).ok());
  CHECK(kiln::test::compare_output(off, r).worst == 100);
  off = r.out;
  off[7] = std::nan("");
  report = kiln::test::compare_output(off, r);
  CHECK_FALSE(report.ok());
  CHECK(report.first_not_finite == 7);

  // LSE: -inf must match exactly; finite values within 1e-3, relative above 1.
  CHECK(kiln::test::compare_lse({-kInf, 100.0, 0.5}, {-kInf, 100.05, 0.5009}).ok());
  CHECK_FALSE(kiln::test::compare_lse({-kInf, 0.0}, {-1e30, 0.0}).ok());
  CHECK_FALSE(kiln::test::compare_lse({0.0, std::nan("")}, {-kInf, 0.0}).ok());
  CHECK_FALSE(kiln::test::compare_lse({100.0, 0.5}, {100.2, 0.5}).ok());
  CHECK(kiln::test::compare_lse({0.5, 0.5}, {0.5, 0.5011}).first_bad == 1);
}

// The arithmetic of a split bf16 q (tma/q_terms.cuh), on the host: once scaled so that the
// largest magnitude is in [128, 256), hi = e4m3(x) and lo = e4m3(x - hi) hold every bf16 value x
// from 2^-2 (2^-9 of the largest) exactly, and the smaller ones within 2^-10 (2^-17 of it).
TEST_CASE("two e4m3 terms hold a scaled bf16 value exactly from 2^-2, as the split q counts on",
          "[attention]") {
  using kiln::test::from_bits;
  using kiln::test::round_to;
  int inexact = 0, off = 0;
  double largest_inexact = 0;
  for (std::uint16_t bits = 0; from_bits(DType::bf16, bits) < 256; ++bits) {  // 0 up, in order
    const double x = from_bits(DType::bf16, bits);
    const double hi = round_to(DType::e4m3, x);
    const double sum = hi + round_to(DType::e4m3, x - hi);
    if (sum != x) ++inexact, largest_inexact = x;
    if (std::fabs(sum - x) > std::ldexp(1.0, -10)) ++off;
  }
  INFO("the largest inexact value: " << largest_inexact);
  CHECK(largest_inexact < 0.25);
  CHECK(inexact > 0);  // the bound is tight: below 2^-2, lo's last bit falls under e4m3's 2^-9
  CHECK(off == 0);
  CHECK(round_to(DType::e4m3, 0.125 * (1 + std::ldexp(1.0, -7)) - 0.125) == 0.0);
}

// ---------------------------------------------------------------------------------------------
// One GPU case (attention_case.hpp): kiln against the reference, every output checked.

// What a run left in out and lse.
struct Downloaded {
  std::vector<std::uint8_t> out, lse;
  bool operator==(const Downloaded&) const = default;
};

// The reference's lse, (heads, total_q), in the order of kiln's lse layout: the same with varlen,
// else (batch, heads, seqlen_q).
std::vector<double> lse_in_layout_order(const Case& c, const std::vector<double>& lse) {
  if (c.varlen()) return lse;
  const auto total_q = static_cast<std::int64_t>(lse.size()) / std::max(c.heads, 1);
  std::vector<double> ordered(lse.size());
  for (std::size_t i = 0; i < ordered.size(); ++i) {
    const std::int64_t n = static_cast<std::int64_t>(i);
    const std::int64_t h = n / c.seqlen_q % c.heads;
    const std::int64_t token = n / (c.heads * c.seqlen_q) * c.seqlen_q + n % c.seqlen_q;
    ordered[i] = lse[static_cast<std::size_t>(h * total_q + token)];
  }
  return ordered;
}

// Out of one run against the reference, and lse when asked (none asked: none written).
void check_outputs(const Case& c, const DeviceCase& d, const Downloaded& got,
                   const ReferenceResult& want) {
  kiln::test::check_out(*d.out, got.out, want, c.heads, c.dim_v());
  if (c.lse) {
    kiln::test::check_lse(*d.lse, got.lse, lse_in_layout_order(c, want.lse));
  } else {
    CHECK(d.lse->written(got.lse) == 0);
  }
}

kiln::AttentionProblem problem_of(const Case& c, const DeviceCase& d) {
  return {.dtype_q = c.q_dtype(),
          .dtype_kv = c.kv_dtype(),
          .dtype_out = c.dtype,
          .head_dim = c.head_dim,
          .head_dim_v = c.dim_v(),
          .band = c.score.causal || c.score.window_left >= 0 || c.score.window_right >= 0,
          .varlen = c.varlen(),
          .softcap = c.score.softcap > 0,
          .alibi = c.score.alibi != Alibi::none,
          .bias = c.bias != Bias::none,
          .variant = d.options.score.variant,
          .seqlen_k = c.varlen() ? std::ranges::max(c.seqlens_k) : c.seqlen_k};
}

// A wgmma config for the dims choose() leaves to the mma kernel on sm_90a (zero-padded to the
// kernel's 64-column tiles); 128 keys a step fit up to 128 + 128 dims.
kiln::AttentionConfig wgmma_config(const Case& c) {
  return {.block_m = 128,
          .block_n = std::max(c.head_dim, c.dim_v()) <= 128 ? 128 : 64,
          .stages = 2,
          .kernel = kiln::AttentionKernel::wgmma};
}

// The tma kernel's config for `c`: as wgmma_config, whose tiles it shares.
kiln::AttentionConfig tma_config(const Case& c) {
  kiln::AttentionConfig config = wgmma_config(c);
  config.kernel = kiln::AttentionKernel::tma;
  return config;
}

// Runs the call in `d` twice on `rt` with `config`, or choose()'s when there is none (outputs
// poisoned each time), and checks out and lse against the reference, the poisoned gaps and
// guards, bit-identical repeats and a memory hit the second time. Without rows to compute
// (`has_rows` false) no kernel may be looked up.
void check_kernel(kiln::Runtime& rt, const Case& c, DeviceCase& d, const ReferenceResult& want,
                  bool has_rows, const std::optional<kiln::AttentionConfig>& config,
                  const char* which) {
  INFO(which);
  const auto run = [&] {
    d.out->poison();
    d.lse->poison();
    if (config) {
      kiln::attention(d.q, d.k, d.v, d.out->view(), d.options, *config, nullptr, rt);
    } else {
      kiln::attention(d.q, d.k, d.v, d.out->view(), d.options, nullptr, rt);
    }
    kiln::test::sync_and_check();
    return Downloaded{d.out->bytes(), d.lse->bytes()};
  };
  const kiln::Stats before = rt.stats();
  const Downloaded first = run();
  const kiln::Stats after_first = rt.stats();
  check_outputs(c, d, first, want);

  // The same call again: the kernel comes from memory and the bits do not change.
  const bool same_bits = run() == first;  // not CHECK(run() == first): it would print it all
  CHECK(same_bits);
  const kiln::Stats after_second = rt.stats();
  if (has_rows) {
    CHECK(after_first.compiles + after_first.disk_hits + after_first.memory_hits >
          before.compiles + before.disk_hits + before.memory_hits);
    CHECK(after_second.memory_hits == after_first.memory_hits + 1);
    CHECK(after_second.compiles == after_first.compiles);
    CHECK(after_second.disk_hits == after_first.disk_hits);
  } else {
    // Nothing to compute: no kernel looked up, and nothing written (checked above).
    CHECK(after_second.memory_hits == before.memory_hits);
    CHECK(after_second.compiles == before.compiles);
    CHECK(after_second.disk_hits == before.disk_hits);
  }
}

// Runs `c` with the kernel choose() picks, with the portable one AMD targets run and, on sm_90a,
// with the wgmma and tma kernels where choose() picks another, on the same inputs, each checked by
// check_kernel against one fp64 reference.
void run_case(kiln::Runtime& rt, const Case& c, std::mt19937& rng) {
  INFO(describe(c));
  Prepared p = prepare(c, rng);
  check_kernel(rt, c, p.d, p.want, p.has_rows, std::nullopt, "the kernel choose() picks");
  check_kernel(rt, c, p.d, p.want, p.has_rows, kiln::choose(problem_of(c, p.d), "gfx90a"),
               "the portable kernel, with AMD's config");
  if (rt.target() == "sm_90a") {
    const kiln::AttentionKernel chosen = kiln::choose(problem_of(c, p.d), "sm_90a").kernel;
    if (chosen != kiln::AttentionKernel::wgmma) {
      check_kernel(rt, c, p.d, p.want, p.has_rows, wgmma_config(c), "the wgmma kernel");
    }
    if (chosen != kiln::AttentionKernel::tma) {
      check_kernel(rt, c, p.d, p.want, p.has_rows, tma_config(c), "the tma kernel");
    }
  }
}

// fp8 k and v (Case::kv_fp8), which the mma kernel reads (and tma, on sm_90a): with choose()'s
// config, with mma configs of other tiles (32 and 128 keys a step, 1 to 3 stages, 4 and 8 warps)
// and on sm_90a a tma config of other tiles (one or three consumer warpgroups, more staging
// entries), on the same inputs, each checked by check_kernel against one fp64 reference.
void run_fp8_case(kiln::Runtime& rt, const Case& c, std::mt19937& rng) {
  INFO(describe(c));
  Prepared p = prepare(c, rng);
  check_kernel(rt, c, p.d, p.want, p.has_rows, std::nullopt, "the kernel choose() picks");
  const bool wide = std::max(c.head_dim, c.dim_v()) > 128;
  if (rt.target() == "sm_90a" && std::min(c.head_dim, c.dim_v()) >= 64) {
    const bool narrow = std::max(c.head_dim, c.dim_v()) <= 64;
    check_kernel(rt, c, p.d, p.want, p.has_rows,
                 kiln::AttentionConfig{.block_m = narrow ? 192 : 64,
                                       .block_n = narrow ? 128 : 64,
                                       .stages = wide ? 2 : 3,
                                       .kernel = kiln::AttentionKernel::tma},
                 "the tma kernel, other tiles");
  }
  check_kernel(rt, c, p.d, p.want, p.has_rows,
               kiln::AttentionConfig{.block_m = 64, .block_n = 32, .warps = 4, .stages = 3},
               "the mma kernel, 64 x 32 tiles, 3 stages");
  check_kernel(rt, c, p.d, p.want, p.has_rows,
               kiln::AttentionConfig{
                   .block_m = 128, .block_n = wide ? 64 : 128, .warps = 8, .stages = wide ? 1 : 2},
               "the mma kernel, 8 warps");
}

// q, k and v in e4m3 (Case::q_fp8), which the tma kernel alone takes: with choose()'s config
// and (head dims up to 128, where they fit) with the other tiles of 128 and 256 keys a block
// (256: each block's P V after its softmax, split_pv), on the same inputs, each checked by
// check_kernel against one fp64 reference of the dequantized inputs, whose plain baseline rounds
// P to e4m3 as the kernel does.
void run_all_fp8_case(kiln::Runtime& rt, Case c, std::mt19937& rng) {
  c.kv_fp8 = DType::e4m3;
  c.q_fp8 = true;
  INFO(describe(c));
  Prepared p = prepare(c, rng);
  check_kernel(rt, c, p.d, p.want, p.has_rows, std::nullopt, "the kernel choose() picks");
  if (std::max(c.head_dim, c.dim_v()) > 128) return;
  const kiln::AttentionConfig chosen = kiln::choose(problem_of(c, p.d), "sm_90a");
  for (const auto& [block_n, stages] : {std::pair{128, 2}, {128, 3}, {256, 2}}) {
    if (chosen.block_n == block_n && chosen.stages == stages) continue;
    INFO("block_n " << block_n << ", stages " << stages);
    check_kernel(rt, c, p.d, p.want, p.has_rows,
                 kiln::AttentionConfig{.block_m = 128,
                                       .block_n = block_n,
                                       .stages = stages,
                                       .kernel = kiln::AttentionKernel::tma},
                 "the tma kernel, other tiles");
  }
}

// fp8 tests' first case: GQA at head dim 128 with q and out in `dtype` over e4m3 k and v with
// descales.
Case fp8_gqa_case(DType dtype) {
  return {.dtype = dtype,
          .batch = 2,
          .seqlen_q = 113,
          .seqlen_k = 203,
          .heads = 4,
          .heads_kv = 2,
          .head_dim = 128,
          .lse = true,
          .kv_fp8 = DType::e4m3,
          .descales = true};
}

// The fp8 cases both fp8 tests run, over e4m3 k and v with descales: head dims `dims` (head_dim,
// head_dim_v) causal, and at `head_dim` a window with softcap, ALiBi and sinks in BHSD strides,
// user variants (a document mask, whose logit hook sees the descaled logit, and a key padding
// mask); at 128 varlen with seqused_k, and long sequences (choose()'s tiles for long keys).
std::vector<Case> fp8_cases(std::initializer_list<std::pair<int, int>> dims, int head_dim) {
  std::vector<Case> cases;
  for (auto [dim, dim_v] : dims) {
    cases.push_back({.batch = 2,
                     .seqlen_q = 77,
                     .seqlen_k = 150,
                     .heads = 2,
                     .heads_kv = 1,
                     .head_dim = dim,
                     .head_dim_v = dim_v,
                     .score = {.causal = true},
                     .lse = true});
  }
  cases.push_back({.seqlen_q = 200,
                   .seqlen_k = 300,
                   .heads = 4,
                   .heads_kv = 4,
                   .head_dim = head_dim,
                   .score = {.window_left = 40,
                             .window_right = 8,
                             .softcap = 30,
                             .alibi = Alibi::per_head,
                             .sinks = true},
                   .layout = Layout::bhsd,
                   .lse = true});
  cases.push_back({.heads = 8,
                   .heads_kv = 2,
                   .head_dim = 128,
                   .score = {.causal = true},
                   .lse = true,
                   .seqlens_q = {0, 1, 130, 77},
                   .seqlens_k = {5, 1, 300, 64},
                   .seqused_k = {5, 0, 250, 64}});
  for (UserVariant variant : {UserVariant::document, UserVariant::key_padding}) {
    cases.push_back({.batch = 2,
                     .seqlen_q = 90,
                     .seqlen_k = 130,
                     .heads = 4,
                     .heads_kv = 2,
                     .head_dim = head_dim,
                     .score = {.causal = true, .variant = variant},
                     .lse = true});
  }
  cases.push_back({.seqlen_q = 2049,
                   .seqlen_k = 2049,
                   .heads = 2,
                   .heads_kv = 1,
                   .head_dim = 128,
                   .score = {.causal = true},
                   .lse = true});
  for (Case& c : cases) {
    c.kv_fp8 = DType::e4m3;
    c.descales = true;
  }
  return cases;
}

// `count` bf16 values from a normal distribution, as their bits.
std::vector<std::uint16_t> random_bf16(std::size_t count, std::mt19937& rng) {
  std::vector<std::uint16_t> out;
  for (double x : kiln::test::random_normal(DType::bf16, count, rng)) {
    out.push_back(kiln::test::to_bits(DType::bf16, x));
  }
  return out;
}

}  // namespace

TEST_CASE("attention matches the reference at odd sequence lengths", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(1);
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype, .batch = 2, .heads = 4, .heads_kv = 4, .lse = true};
    for (auto [sq, sk] : {std::pair{1, 1}, {17, 17}, {113, 203}, {203, 113}, {1, 1023}}) {
      c.seqlen_q = sq;
      c.seqlen_k = sk;
      run_case(rt, c, rng);
    }
    // Long sequences: one batch of few heads keeps the fp64 reference to a few seconds.
    c.batch = 1;
    c.heads = c.heads_kv = 2;
    c.seqlen_q = 1023;
    c.seqlen_k = 1024;
    run_case(rt, c, rng);
    c.heads_kv = 1;
    c.seqlen_q = c.seqlen_k = 2049;
    run_case(rt, c, rng);
  }
}

// fp8 k and v under bf16 and f16 q, widened exactly as they are read, with FlashAttention-3's
// descales (one per sequence and kv head) and without: e4m3 and e5m2, GQA, head dims 64 to 256
// (and 192/128; 80 and 96, whose fp8 rows swizzle otherwise), every mask, softcap, ALiBi, sinks,
// a bias, varlen with seqused_k, BHSD strides, user variants and long sequences. The reference
// attends the stored values times the descales.
TEST_CASE("attention over fp8 k and v: e4m3 and e5m2, descales, masks, varlen",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  if (rt.target().arch() < 89) {
    WARN("skipped: fp8 k and v need sm_89 or newer, not " << rt.target().name());
    return;
  }
  std::mt19937 rng(41);
  for (DType fp8 : {DType::e4m3, DType::e5m2}) {
    for (DType dtype : kDTypes) {
      Case c = fp8_gqa_case(dtype);
      c.kv_fp8 = fp8;
      run_fp8_case(rt, c, rng);
    }
  }
  run_fp8_case(rt,
               {.dtype = DType::f16,
                .batch = 2,
                .seqlen_q = 64,
                .seqlen_k = 96,
                .heads = 2,
                .heads_kv = 2,
                .bias = Bias::head_broadcast,
                .kv_fp8 = DType::e5m2},
               rng);
  for (const Case& c : fp8_cases({{64, 64}, {256, 256}, {192, 128}, {80, 80}, {96, 96}}, 64)) {
    run_fp8_case(rt, c, rng);
  }
}

// The all-fp8 forward (sm_90a): e4m3 q, k and v with FlashAttention-3's descales (q's too) and
// without, out in bf16 and f16, GQA, head dims 64, 128 and 256 (256 and 128/192: P V 128 columns
// at a time; 192/128, 80/64: padded rows; 32, 48/64 and 64/128: Q and K in 64-byte chunks, the
// first two wider than the rows), every mask, softcap, ALiBi, sinks, varlen with
// seqused_k, BHSD strides, user variants and long sequences. The reference attends the stored
// values times the descales.
TEST_CASE("attention over fp8 q, k and v: descales, masks, varlen", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  if (rt.target() != "sm_90a") {
    WARN("skipped: the all-fp8 forward runs on sm_90a, not " << rt.target().name());
    return;
  }
  std::mt19937 rng(47);
  for (DType dtype : kDTypes) run_all_fp8_case(rt, fp8_gqa_case(dtype), rng);
  run_all_fp8_case(rt,
                   {.dtype = DType::f16,
                    .batch = 2,
                    .seqlen_q = 64,
                    .seqlen_k = 96,
                    .heads = 2,
                    .heads_kv = 2,
                    .head_dim = 128},
                   rng);
  for (const Case& c : fp8_cases(
           {{64, 64}, {32, 32}, {48, 64}, {64, 128}, {256, 256}, {128, 192}, {192, 128}, {80, 64}},
           128)) {
    run_all_fp8_case(rt, c, rng);
  }
}

// KILN_DEBUG copies fp8 k and v's descales to the host before the launch and refuses one that is
// not finite and positive (k's joins the softmax scale, where 0 or less empties or inverts the
// softmax), naming it; the output stays untouched. The same call with good descales runs.
TEST_CASE("attention under KILN_DEBUG refuses fp8 descales that are not finite and positive",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Options options = kiln::test::gpu_options();
  options.debug = true;
  kiln::Runtime rt(options);
  if (rt.target().arch() < 89) {
    WARN("skipped: fp8 k and v need sm_89 or newer, not " << rt.target().name());
    return;
  }
  std::mt19937 rng(43);
  const Case c{.batch = 2,
               .seqlen_q = 16,
               .seqlen_k = 40,
               .heads = 4,
               .heads_kv = 2,
               .kv_fp8 = DType::e4m3,
               .descales = true};
  Prepared p = prepare(c, rng);
  for (const float bad : {0.f, -1.f, std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()}) {
    INFO("descale " << bad);
    const auto descales = kiln::test::upload(std::vector<float>{1.f, 2.f, bad, 0.5f});
    kiln::AttentionOptions o = p.d.options;
    o.v_descale = TensorView::contiguous(descales->get(), DType::f32, {2, 2});
    p.d.out->poison();
    CHECK_THROWS_WITH(kiln::attention(p.d.q, p.d.k, p.d.v, p.d.out->view(), o, nullptr, rt),
                      Catch::Contains("v_descale[1][0] is") &&
                          Catch::Contains("descales must be finite and positive"));
    kiln::test::sync_and_check();
    CHECK(p.d.out->written(p.d.out->bytes()) == 0);
  }
  p.d.out->poison();
  kiln::attention(p.d.q, p.d.k, p.d.v, p.d.out->view(), p.d.options, nullptr, rt);
  kiln::test::sync_and_check();
  kiln::test::check_out(*p.d.out, p.d.out->bytes(), p.want, c.heads, c.dim_v());
}

TEST_CASE("attention matches the reference with the tiles of long sequences", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(11);
  // From kLongSeqlenK keys choose() takes longer key blocks on sm_90a (176 or 192 keys): a key
  // count that leaves a partial last block, with and without a mask, padded and varlen.
  static_assert(kiln::kLongSeqlenK <= 2100);
  for (int dim : {64, 128}) {
    for (bool causal : {false, true}) {
      run_case(rt,
               {.seqlen_q = 300,
                .seqlen_k = 2100,
                .heads = 2,
                .heads_kv = 1,
                .head_dim = dim,
                .score = {.causal = causal},
                .lse = true},
               rng);
    }
    run_case(rt,
             {.dtype = DType::f16,
              .heads = 2,
              .heads_kv = 2,
              .head_dim = dim,
              .score = {.causal = true},
              .seqlens_q = {200, 77},
              .seqlens_k = {2100, 2300}},
             rng);
  }
}

TEST_CASE("attention captured in a CUDA graph: the tma kernel deals tiles round-robin",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Options options = kiln::test::gpu_options();
  options.debug = false;  // the debug checks copy to the host, which a capture forbids
  kiln::Runtime rt(options);
  std::mt19937 rng(12);
  // Under capture the runtime names no stream, so the persistent tma kernel gets no tile
  // counter and each CTA takes every gridDim-th tile: the replay must give the eager call's bits.
  for (bool causal : {false, true}) {
    const Case c{.batch = 3,
                 .seqlen_q = 700,
                 .seqlen_k = 900,
                 .heads = 4,
                 .heads_kv = 2,
                 .head_dim = 128,
                 .score = {.causal = causal},
                 .lse = true};
    INFO(describe(c));
    Prepared p = prepare(c, rng);
    kiln::test::GraphOnStream g;
    const auto call = [&] {
      kiln::attention(p.d.q, p.d.k, p.d.v, p.d.out->view(), p.d.options, g.stream, rt);
    };
    const auto run = [&](const std::function<void()>& work) {
      p.d.out->poison();
      p.d.lse->poison();
      KILN_CUDA_CHECK(cudaDeviceSynchronize());  // a non-blocking stream does not wait for it
      work();
      KILN_CUDA_CHECK(cudaStreamSynchronize(g.stream));
      kiln::test::sync_and_check();
      return Downloaded{p.d.out->bytes(), p.d.lse->bytes()};
    };
    // Eager first: it compiles and loads the kernel, which a capture cannot do.
    const Downloaded eager = run(call);
    check_outputs(c, p.d, eager, p.want);
    g.capture(call);
    const Downloaded replayed = run([&] { KILN_CUDA_CHECK(cudaGraphLaunch(g.exec, g.stream)); });
    check_outputs(c, p.d, replayed, p.want);
    const bool same_bits = replayed == eager;
    CHECK(same_bits);
  }
}

TEST_CASE("attention matches the reference for every head dim", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(2);
  for (int dim : {8, 24, 40, 64, 72, 96, 128, 168, 200, 256}) {
    // Each dim compiles its own kernels: bf16 without a mask, f16 with one.
    Case c{
        .batch = 2, .seqlen_q = 113, .seqlen_k = 203, .heads = 2, .heads_kv = 2, .head_dim = dim};
    run_case(rt, c, rng);
    c = {.dtype = DType::f16,
         .batch = 2,
         .seqlen_q = 203,
         .seqlen_k = 113,
         .heads = 2,
         .heads_kv = 1,
         .head_dim = dim,
         .score = {.causal = true},
         .lse = true};
    run_case(rt, c, rng);
  }
  // DeepSeek's split: a wider q.k than v.
  for (DType dtype : kDTypes) {
    for (bool causal : {false, true}) {
      run_case(rt,
               {.dtype = dtype,
                .batch = 2,
                .seqlen_q = 113,
                .seqlen_k = 203,
                .heads = 4,
                .heads_kv = 2,
                .head_dim = 192,
                .head_dim_v = 128,
                .score = {.causal = causal},
                .lse = true},
               rng);
    }
  }
}

TEST_CASE("attention masks: causal both ways, sliding windows, fully masked rows",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(3);
  struct Mask {
    bool causal;
    int left, right;
    bool top_left;
  };
  const Mask masks[] = {{true, -1, -1, false},
                        {true, -1, -1, true},
                        {false, 32, 0, false},
                        {false, 16, 8, false},
                        {false, 0, 0, false},
                        {false, 16, 8, true},
                        {false, -1, 5, false},
                        {false, 7, -1, false},
                        {true, 20, -1, true},
                        // causal takes any window_right as 0, as FlashAttention: Hugging Face's
                        // sliding-window layers pass causal with (w - 1, w - 1)
                        {true, -1, 5, false},
                        {true, 31, 31, false}};
  for (DType dtype : kDTypes) {
    // 203 x 113 bottom-right leaves the first 90 rows of a causal mask without keys: out 0 and
    // lse -inf; windows of 113 x 203 top-left do the same to rows past the keys' reach.
    for (auto [sq, sk] : {std::pair{113, 203}, {203, 113}, {17, 17}, {1, 1023}}) {
      for (const Mask& m : masks) {
        run_case(rt,
                 {.dtype = dtype,
                  .batch = 2,
                  .seqlen_q = sq,
                  .seqlen_k = sk,
                  .heads = 2,
                  .heads_kv = 2,
                  .score = {.causal = m.causal,
                            .window_left = m.left,
                            .window_right = m.right,
                            .top_left = m.top_left},
                  .lse = true},
                 rng);
      }
    }
  }
  Case c{.seqlen_q = 1023,
         .seqlen_k = 1024,
         .heads = 2,
         .heads_kv = 2,
         .score = {.causal = true},
         .lse = true};
  run_case(rt, c, rng);
  c.dtype = DType::f16;
  c.seqlen_q = c.seqlen_k = 2049;
  run_case(rt, c, rng);
  c = {.seqlen_q = 2049,
       .seqlen_k = 2049,
       .score = {.window_left = 256, .window_right = 0},
       .lse = true};
  run_case(rt, c, rng);
}

TEST_CASE("attention GQA ratios 1, 4 and 8 and MQA", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(4);
  for (auto [heads, heads_kv] : {std::pair{4, 4}, {8, 2}, {16, 2}, {8, 1}}) {
    for (bool causal : {false, true}) {
      run_case(rt,
               {.batch = 2,
                .seqlen_q = 113,
                .seqlen_k = 203,
                .heads = heads,
                .heads_kv = heads_kv,
                .score = {.causal = causal},
                .lse = true},
               rng);
    }
    run_case(rt,
             {.dtype = DType::f16,
              .seqlen_q = 17,
              .seqlen_k = 1023,
              .heads = heads,
              .heads_kv = heads_kv,
              .head_dim = 128,
              .lse = true},
             rng);
  }
}

TEST_CASE("attention reads strided inputs: packed QKV, BHSD memory, padded strides",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(5);
  for (DType dtype : kDTypes) {
    for (bool causal : {false, true}) {
      Case c{.dtype = dtype,
             .batch = 2,
             .seqlen_q = 113,
             .seqlen_k = 113,
             .heads = 4,
             .heads_kv = 4,
             .score = {.causal = causal},
             .layout = Layout::packed_qkv,
             .lse = true};
      run_case(rt, c, rng);
      c.seqlen_k = 203;
      c.heads_kv = 2;
      c.layout = Layout::bhsd;
      run_case(rt, c, rng);
      c.seqlen_q = 203;
      c.seqlen_k = 113;
      c.heads_kv = 1;
      c.head_dim = 40;
      c.layout = Layout::padded;
      run_case(rt, c, rng);
    }
  }
  // Head dims that are not a multiple of the 16-wide tiles must not read into the gaps.
  for (int dim : {8, 24, 72}) {
    run_case(rt,
             {.batch = 2,
              .seqlen_q = 17,
              .seqlen_k = 113,
              .heads = 2,
              .heads_kv = 2,
              .head_dim = dim,
              .layout = Layout::padded,
              .lse = true},
             rng);
  }
}

TEST_CASE("attention softcap", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(6);
  for (DType dtype : kDTypes) {
    // Logits of std 1 (the default scale) barely reach a cap of 30: cap them at 2, or raise
    // the scale to 1 (std 8) under a cap of 10, so that tanh matters.
    Case c{.dtype = dtype,
           .batch = 2,
           .seqlen_q = 113,
           .seqlen_k = 203,
           .heads = 2,
           .heads_kv = 2,
           .score = {.softcap = 2},
           .lse = true};
    run_case(rt, c, rng);
    c.seqlen_q = 203;
    c.seqlen_k = 113;
    c.score.causal = true;
    c.score.softcap = 10;
    c.score.softmax_scale = 1.0f;
    run_case(rt, c, rng);
  }
}

TEST_CASE("attention ALiBi slopes per head and per batch and head", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(7);
  for (DType dtype : kDTypes) {
    for (Alibi alibi : {Alibi::per_head, Alibi::per_batch_head}) {
      for (auto [sq, sk] : {std::pair{113, 203}, {203, 113}}) {
        Case c{.dtype = dtype,
               .batch = 2,
               .seqlen_q = sq,
               .seqlen_k = sk,
               .heads = 4,
               .heads_kv = 2,
               .score = {.alibi = alibi},
               .lse = true};
        run_case(rt, c, rng);
        // Distances from the diagonal change with the alignment.
        c.score.causal = true;
        c.score.top_left = sq > sk;
        run_case(rt, c, rng);
      }
    }
  }
}

TEST_CASE("attention additive bias: full, broadcast by stride 0, transposed", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(8);
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype,
           .batch = 2,
           .seqlen_q = 113,
           .seqlen_k = 203,
           .heads = 4,
           .heads_kv = 4,
           .lse = true};
    for (Bias bias : {Bias::full, Bias::batch_broadcast, Bias::head_broadcast, Bias::transposed}) {
      c.bias = bias;
      run_case(rt, c, rng);
    }
    c.seqlen_q = 203;
    c.seqlen_k = 113;
    c.heads_kv = 1;
    c.score.causal = true;
    run_case(rt, c, rng);
  }
}

TEST_CASE("attention varlen: cu_seqlens with empty sequences, seqused_k, lse (heads, total_q)",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(9);
  for (DType dtype : kDTypes) {
    // Sequence 2 has queries but no keys (rows fully masked), sequence 1 keys but no queries.
    Case c{.dtype = dtype,
           .heads = 4,
           .heads_kv = 2,
           .lse = true,
           .seqlens_q = {113, 0, 17, 203, 1},
           .seqlens_k = {203, 64, 0, 113, 1}};
    run_case(rt, c, rng);
    c.score.causal = true;
    run_case(rt, c, rng);
    c.score.causal = false;
    c.score.window_left = 16;
    c.score.window_right = 8;
    c.layout = Layout::padded;
    run_case(rt, c, rng);
    c.score.window_left = c.score.window_right = -1;
    c.layout = Layout::bhsd;
    run_case(rt, c, rng);
    // seqused_k trims keys, and the bottom-right diagonal moves with it.
    c.layout = Layout::contiguous;
    c.score.causal = true;
    c.seqused_k = {150, 3, 0, 113, 0};
    run_case(rt, c, rng);
    run_case(rt,
             {.dtype = dtype,
              .heads = 2,
              .heads_kv = 2,
              .layout = Layout::packed_qkv,
              .lse = true,
              .seqlens_q = {17, 113, 0},
              .seqlens_k = {17, 113, 0}},
             rng);
  }
  // Without an lse, and a lone sequence as long as a padded case.
  run_case(rt, {.heads = 2, .heads_kv = 2, .seqlens_q = {1023}, .seqlens_k = {1024}}, rng);
}

TEST_CASE("attention seqused_k on a padded batch", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(10);
  for (bool causal : {false, true}) {
    run_case(rt,
             {.batch = 3,
              .seqlen_q = 113,
              .seqlen_k = 203,
              .heads = 2,
              .heads_kv = 2,
              .score = {.causal = causal},
              .lse = true,
              .seqused_k = {203, 57, 0}},
             rng);
  }
}

TEST_CASE("attention with nothing to compute: batch 0, seqlen 0, no keys", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(11);
  // run_case checks that nothing is written and no kernel is looked up when there are no rows.
  Case c{.batch = 0, .seqlen_q = 17, .seqlen_k = 17, .heads = 2, .heads_kv = 2, .lse = true};
  run_case(rt, c, rng);
  c.batch = 2;
  c.seqlen_q = 0;
  run_case(rt, c, rng);
  run_case(rt, {.heads = 2, .heads_kv = 2, .lse = true, .seqlens_q = {0, 0}, .seqlens_k = {5, 0}},
           rng);
  // Rows but no keys: every row is fully masked, so out is 0 and lse -inf.
  c.seqlen_q = 17;
  c.seqlen_k = 0;
  run_case(rt, c, rng);
  c.score.causal = true;
  run_case(rt, c, rng);
}

// Sinks (gpt-oss, StreamingLLM) at every head dim's tiles, under each mask (fully masked rows
// included, whose lse is the sink), with GQA, varlen and ALiBi, through every kernel run_case
// runs. random_sinks gives the last head none (-inf).
TEST_CASE("attention sinks under every mask with GQA and varlen", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(17);
  for (const int dim : {64, 128, 256}) {
    for (DType dtype : kDTypes) {
      run_case(rt,
               {.dtype = dtype,
                .batch = 2,
                .seqlen_q = 150,
                .seqlen_k = 300,
                .heads = 4,
                .heads_kv = 2,
                .head_dim = dim,
                .score = {.sinks = true},
                .lse = true},
               rng);
    }
    // Causal with more queries than keys: the first rows see no key.
    run_case(rt,
             {.seqlen_q = 200,
              .seqlen_k = 70,
              .heads = 3,
              .heads_kv = 1,
              .head_dim = dim,
              .score = {.causal = true, .sinks = true},
              .lse = true},
             rng);
    // A sliding window, top-left, with ALiBi.
    run_case(rt,
             {.batch = 2,
              .seqlen_q = 257,
              .seqlen_k = 257,
              .heads = 4,
              .heads_kv = 4,
              .head_dim = dim,
              .score = {.causal = true,
                        .window_left = 31,
                        .top_left = true,
                        .alibi = Alibi::per_head,
                        .sinks = true},
              .lse = true},
             rng);
    // Varlen with an empty sequence and sequences without keys.
    run_case(rt,
             {.heads = 8,
              .heads_kv = 2,
              .head_dim = dim,
              .score = {.causal = true, .sinks = true},
              .lse = true,
              .seqlens_q = {1, 0, 130, 64},
              .seqlens_k = {300, 5, 0, 64}},
             rng);
  }
}

// User variants through every kernel run_case runs: ALiBi as a variant against the reference's
// ALiBi, a document mask (segment ids in a variant tensor) against a 0 / -inf bias, and a
// relative position bias table (a tensor and a scalar) against the same bias; with the band,
// softcap and sinks beside them.
TEST_CASE("attention with user variants: ALiBi and a document mask and position biases",
          "[gpu][attention][variant]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(19);
  for (const int dim : {64, 128, 256}) {
    run_case(rt,
             {.batch = 2,
              .seqlen_q = 150,
              .seqlen_k = 333,
              .heads = 4,
              .heads_kv = 2,
              .head_dim = dim,
              .score = {.causal = true, .top_left = dim == 64, .variant = UserVariant::alibi},
              .lse = true},
             rng);
    run_case(rt,
             {.dtype = DType::f16,
              .batch = 2,
              .seqlen_q = 400,
              .seqlen_k = 400,
              .heads = 4,
              .heads_kv = 1,
              .head_dim = dim,
              .score = {.causal = dim == 128,
                        .softcap = 5,
                        .sinks = dim == 64,
                        .variant = UserVariant::document},
              .lse = true},
             rng);
    run_case(
        rt,
        {.batch = 2,
         .seqlen_q = 100,
         .seqlen_k = 260,
         .heads = 4,
         .heads_kv = 2,
         .head_dim = dim,
         .score = {.window_left = 40, .window_right = 8, .variant = UserVariant::relative_bias},
         .lse = true},
        rng);
    run_case(rt,
             {.dtype = DType::f16,
              .batch = 2,
              .seqlen_q = 190,
              .seqlen_k = 300,
              .heads = 3,
              .heads_kv = 3,
              .head_dim = dim,
              .score = {.variant = UserVariant::t5_bias},
              .lse = true},
             rng);
  }
}

TEST_CASE("attention with user variants: a key padding mask hook and sink hooks",
          "[gpu][attention][variant]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(21);
  for (const int dim : {64, 128, 256}) {
    // The last sequence is all padding: its rows see no key.
    run_case(
        rt,
        {.batch = 3,
         .seqlen_q = 130,
         .seqlen_k = 257,
         .heads = 4,
         .heads_kv = 2,
         .head_dim = dim,
         .score = {.causal = dim == 128, .sinks = dim == 256, .variant = UserVariant::key_padding},
         .lse = true},
        rng);
    run_case(rt,
             {.dtype = DType::f16,
              .batch = 2,
              .seqlen_q = 77,
              .seqlen_k = 200,
              .heads = 4,
              .heads_kv = 1,
              .head_dim = dim,
              .score = {.window_left = 50,
                        .window_right = 0,
                        .sinks = dim == 64,
                        .variant = UserVariant::softmax_one},
              .lse = true},
             rng);
    run_case(rt,
             {.batch = 2,
              .seqlen_q = 150,
              .seqlen_k = 150,
              .heads = 4,
              .heads_kv = 2,
              .head_dim = dim,
              .score = {.causal = true,
                        .top_left = dim == 128,
                        .softcap = dim == 256 ? 10.f : 0.f,
                        .sinks = dim != 64,
                        .variant = UserVariant::row_sinks},
              .lse = true},
             rng);
  }
}

TEST_CASE("attention with every feature at once", "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(12);
  for (DType dtype : kDTypes) {
    run_case(rt,
             {.dtype = dtype,
              .batch = 2,
              .seqlen_q = 203,
              .seqlen_k = 331,
              .heads = 8,
              .heads_kv = 2,
              .head_dim = 128,
              .score = {.causal = true,
                        .window_left = 64,
                        .softcap = 5,
                        .alibi = Alibi::per_batch_head,
                        .sinks = true},
              .bias = Bias::head_broadcast,
              .lse = true},
             rng);
    run_case(rt,
             {.dtype = dtype,
              .heads = 8,
              .heads_kv = 1,
              .head_dim = 96,
              .score = {.causal = true,
                        .window_left = 48,
                        .top_left = true,
                        .softcap = 5,
                        .alibi = Alibi::per_head,
                        .sinks = true},
              .layout = Layout::padded,
              .lse = true,
              .seqlens_q = {113, 0, 203},
              .seqlens_k = {203, 17, 113},
              .seqused_k = {180, 17, 100}},
             rng);
  }
}

TEST_CASE("attention with keys broadcast over the batch (stride 0), which TMA cannot tile",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(13);
  const std::int64_t batch = 2, seqlen = 77, heads = 2, dim = 128;
  const auto q = random_bf16(batch * seqlen * heads * dim, rng);
  const auto q_buffer = kiln::test::upload(q);
  const auto kv_buffer = kiln::test::upload(random_bf16(seqlen * heads * dim, rng));
  DeviceBuffer out_a(q.size() * 2), out_b(q.size() * 2);
  const auto q_view =
      kiln::TensorView::contiguous(q_buffer->get(), DType::bf16, {batch, seqlen, heads, dim});
  // Every batch reads the same keys and values: batch stride 0.
  kiln::TensorView k_view =
      kiln::TensorView::contiguous(kv_buffer->get(), DType::bf16, {batch, seqlen, heads, dim});
  k_view.strides[0] = 0;
  const auto out_view = [&](DeviceBuffer& b) {
    return kiln::TensorView::contiguous(b.get(), DType::bf16, {batch, seqlen, heads, dim});
  };
  const kiln::AttentionOptions options{.score = {.causal = true}};
  const kiln::AttentionProblem problem{.head_dim = dim, .head_dim_v = dim, .band = true};
  INFO("choose() picks " << static_cast<int>(kiln::choose(problem, rt.target()).kernel));
  out_a.poison();
  out_b.poison();
  // choose()'s kernel: on sm_90a the tma kernel, which hands such inputs to the wgmma kernel.
  kiln::attention(q_view, k_view, k_view, out_view(out_a), options, nullptr, rt);
  kiln::AttentionConfig config = kiln::choose(problem, rt.target());
  if (config.kernel == kiln::AttentionKernel::tma) config.kernel = kiln::AttentionKernel::wgmma;
  kiln::attention(q_view, k_view, k_view, out_view(out_b), options, config, nullptr, rt);
  kiln::test::sync_and_check();
  const auto a = out_a.download<std::uint16_t>(), b = out_b.download<std::uint16_t>();
  CHECK(a == b);
  // Batch 1 saw the same keys as batch 0 but other queries: not a copy of batch 0's output.
  CHECK(!std::equal(a.begin(), a.begin() + a.size() / 2, a.begin() + a.size() / 2));
  const auto nan = std::find_if(a.begin(), a.end(), [](std::uint16_t x) {
    return (x & 0x7F80) == 0x7F80 && (x & 0x7F) != 0;
  });
  CHECK(nan == a.end());
}

// A refused call changes nothing: the fit against the device comes before the kernel is
// compiled or fetched, and before anything is written.
TEST_CASE("attention with a config the device cannot run compiles and writes nothing",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(16);
  const std::int64_t batch = 1, seqlen = 300, heads = 2, dim = 128;
  const auto q_buffer = kiln::test::upload(random_bf16(batch * seqlen * heads * dim, rng));
  const auto q =
      kiln::TensorView::contiguous(q_buffer->get(), DType::bf16, {batch, seqlen, heads, dim});
  DeviceBuffer out(static_cast<std::size_t>(batch * seqlen * heads * dim) * 2);
  out.poison();
  const auto poisoned = out.download<std::uint16_t>();
  const auto out_view =
      kiln::TensorView::contiguous(out.get(), DType::bf16, {batch, seqlen, heads, dim});
  // 256 x 256 tiles of 4 stages at head dim 128 take 612 KiB of shared memory per CTA.
  const kiln::AttentionConfig config{.block_m = 256, .block_n = 256, .warps = 8, .stages = 4};
  const kiln::Stats before = rt.stats();
  CHECK_THROWS_WITH(kiln::attention(q, q, q, out_view, {}, config, nullptr, rt),
                    Catch::Contains("bytes of dynamic shared memory per CTA") &&
                        Catch::Contains("block_m 256, block_n 256, warps 8, stages 4"));
  const kiln::Stats after = rt.stats();
  CHECK(after.compiles + after.compile_failures == before.compiles + before.compile_failures);
  CHECK(after.disk_hits + after.memory_hits + after.loads ==
        before.disk_hits + before.memory_hits + before.loads);
  kiln::test::sync_and_check();
  CHECK(out.download<std::uint16_t>() == poisoned);
}

// What the keys past a sequence's end hold (rows past seqused_k, or past the last sequence's
// keys in a varlen buffer larger than cu_seqlens_k says) must not reach the output: every kernel
// gives the same bits whether those rows are NaN or random numbers.
TEST_CASE("attention ignores whatever the rows past each sequence's keys hold",
          "[gpu][attention]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(14);
  constexpr std::int64_t heads = 2, dim = 128, seqlen_q = 77;
  for (const bool varlen : {false, true}) {
    INFO((varlen ? "varlen" : "padded batch with seqused_k"));
    // Padded: 2 sequences of 203 key rows, using 57 and 150. Varlen: 100 and 80 keys in a
    // buffer of 250 tokens.
    const std::int64_t batch = 2, key_rows = varlen ? 250 : 203;
    const std::vector<int> used = varlen ? std::vector<int>{100, 80} : std::vector<int>{57, 150};
    const std::int64_t kv_count = (varlen ? 1 : batch) * key_rows * heads * dim;
    // Whether key row r of sequence b (padded) or token r (varlen) is past every used key.
    const auto unused = [&](std::int64_t b, std::int64_t r) {
      return varlen ? r >= used[0] + used[1] : r >= used[static_cast<std::size_t>(b)];
    };
    const auto q = random_bf16(static_cast<std::size_t>(batch * seqlen_q * heads * dim), rng);
    auto k = random_bf16(static_cast<std::size_t>(kv_count), rng);
    auto v = random_bf16(static_cast<std::size_t>(kv_count), rng);
    auto k_poisoned = k, v_poisoned = v;
    for (std::int64_t i = 0; i < kv_count; ++i) {
      const std::int64_t row = i / (heads * dim) % key_rows, b = i / (heads * dim * key_rows);
      if (unused(b, row)) k_poisoned[static_cast<std::size_t>(i)] = 0x7FC0;  // bf16 NaN
      if (unused(b, row)) v_poisoned[static_cast<std::size_t>(i)] = 0x7FC0;
    }
    const auto q_buffer = kiln::test::upload(q);
    const std::vector<int> cu_q{0, seqlen_q, 2 * seqlen_q}, cu_k{0, used[0], used[0] + used[1]};
    const auto seqused = kiln::test::upload(used);
    const auto cu_q_buffer = kiln::test::upload(cu_q);
    const auto cu_k_buffer = kiln::test::upload(cu_k);
    kiln::AttentionOptions options{.score = {.causal = true}};
    kiln::TensorView q_view, kv_view;
    const auto kv_shape = [&](void* data) {
      return varlen ? TensorView::contiguous(data, DType::bf16, {key_rows, heads, dim})
                    : TensorView::contiguous(data, DType::bf16, {batch, key_rows, heads, dim});
    };
    if (varlen) {
      q_view = TensorView::contiguous(q_buffer->get(), DType::bf16, {batch * seqlen_q, heads, dim});
      options.cu_seqlens_q = TensorView::contiguous(cu_q_buffer->get(), DType::i32, {batch + 1});
      options.cu_seqlens_k = TensorView::contiguous(cu_k_buffer->get(), DType::i32, {batch + 1});
      options.max_seqlen_q = static_cast<int>(seqlen_q);
      options.max_seqlen_k = used[0];
    } else {
      q_view = TensorView::contiguous(q_buffer->get(), DType::bf16, {batch, seqlen_q, heads, dim});
      options.seqused_k = TensorView::contiguous(seqused->get(), DType::i32, {batch});
    }
    const kiln::AttentionProblem problem{
        .head_dim = dim, .head_dim_v = dim, .band = true, .varlen = varlen};
    std::vector<std::pair<const char*, std::optional<kiln::AttentionConfig>>> configs{
        {"choose()'s", std::nullopt},
        {"mma", kiln::AttentionConfig{128, 64, 4, 1}},
        {"portable", kiln::choose(problem, "gfx90a")}};
    if (rt.target() == "sm_90a") {
      configs.push_back({"wgmma", kiln::AttentionConfig{.block_m = 128,
                                                        .block_n = 128,
                                                        .stages = 2,
                                                        .kernel = kiln::AttentionKernel::wgmma}});
      configs.push_back(
          {"tma",
           kiln::AttentionConfig{
               .block_m = 128, .block_n = 128, .stages = 2, .kernel = kiln::AttentionKernel::tma}});
    }
    for (const auto& [name, config] : configs) {
      INFO(name << " kernel");
      const auto run = [&](const std::vector<std::uint16_t>& k_bits,
                           const std::vector<std::uint16_t>& v_bits) {
        const auto k_buffer = kiln::test::upload(k_bits);
        const auto v_buffer = kiln::test::upload(v_bits);
        DeviceBuffer out(q.size() * 2);
        out.poison();
        const TensorView out_view =
            varlen ? TensorView::contiguous(out.get(), DType::bf16, {batch * seqlen_q, heads, dim})
                   : TensorView::contiguous(out.get(), DType::bf16, {batch, seqlen_q, heads, dim});
        if (config) {
          kiln::attention(q_view, kv_shape(k_buffer->get()), kv_shape(v_buffer->get()), out_view,
                          options, *config, nullptr, rt);
        } else {
          kiln::attention(q_view, kv_shape(k_buffer->get()), kv_shape(v_buffer->get()), out_view,
                          options, nullptr, rt);
        }
        kiln::test::sync_and_check();
        return out.download<std::uint16_t>();
      };
      const auto clean = run(k, v);
      const auto poisoned = run(k_poisoned, v_poisoned);
      const bool same_bits = clean == poisoned;
      CHECK(same_bits);
      const auto nan = std::find_if(poisoned.begin(), poisoned.end(), [](std::uint16_t x) {
        return (x & 0x7F80) == 0x7F80 && (x & 0x7F) != 0;
      });
      CHECK(nan == poisoned.end());
    }
  }
}
