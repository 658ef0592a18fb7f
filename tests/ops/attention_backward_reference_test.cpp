// SPDX-License-Identifier: Apache-2.0
// The backward reference (no GPU): its fp64 gradients against central finite differences of
// attention_reference's fp64 output on small cases of every feature, a wrong gradient caught, and
// its plain-dtype baseline a little off the fp64 gradients, as the acceptance rule needs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attention_backward_reference.hpp"
#include "attention_reference.hpp"

namespace {

using kiln::DType;
using kiln::test::attention_backward_reference;
using kiln::test::attention_reference;
using kiln::test::BackwardReference;
using kiln::test::ReferenceProblem;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Finite differences at this step agree with an fp64 gradient to about 1e-9 of its largest
// element (rounding over the step) plus h^2 (truncation); a wrong one differs by far more.
constexpr double kStep = 1e-6;
constexpr double kTolerance = 1e-6;

struct Inputs {
  std::vector<double> q, k, v, dout;
};

Inputs random_inputs(const ReferenceProblem& p, std::mt19937& rng) {
  const auto total_q = static_cast<std::size_t>(p.cu_seqlens_q.back());
  const auto total_k = static_cast<std::size_t>(p.cu_seqlens_k.back());
  const auto hq = static_cast<std::size_t>(p.heads), hkv = static_cast<std::size_t>(p.heads_kv);
  const auto d = static_cast<std::size_t>(p.head_dim), dv = static_cast<std::size_t>(p.head_dim_v);
  return {kiln::test::random_normal(p.dtype, total_q * hq * d, rng),
          kiln::test::random_normal(p.dtype, total_k * hkv * d, rng),
          kiln::test::random_normal(p.dtype, total_k * hkv * dv, rng),
          kiln::test::random_normal(p.dtype, total_q * hq * dv, rng)};
}

// sum(out * dout), out from the fp64 forward reference.
double loss(const ReferenceProblem& p, const Inputs& in) {
  const std::vector<double> out = attention_reference(p, in.q, in.k, in.v).out;
  double sum = 0;
  for (std::size_t i = 0; i < out.size(); ++i) sum += out[i] * in.dout[i];
  return sum;
}

// The central difference of the loss in each element of `x`, which `in` or `p` holds; 0 for an
// infinite one (a bias's mask, a head without a sink), which no step moves.
std::vector<double> numeric_gradient(ReferenceProblem& p, Inputs& in, std::vector<double>& x) {
  std::vector<double> gradient(x.size(), 0.0);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double at = x[i];
    if (!std::isfinite(at)) continue;
    x[i] = at + kStep;
    const double above = loss(p, in);
    x[i] = at - kStep;
    const double below = loss(p, in);
    x[i] = at;
    gradient[i] = (above - below) / (2 * kStep);
  }
  return gradient;
}

// The largest difference between two gradients, relative to the larger one's largest element.
double mismatch(const std::vector<double>& numeric, const std::vector<double>& analytic) {
  REQUIRE(numeric.size() == analytic.size());
  double scale = 0, worst = 0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    REQUIRE(std::isfinite(analytic[i]));
    scale = std::max({scale, std::fabs(numeric[i]), std::fabs(analytic[i])});
    worst = std::max(worst, std::fabs(numeric[i] - analytic[i]));
  }
  return scale == 0 ? 0 : worst / scale;
}

// The central differences of the loss in each element of a table of p.bias's values of `shape`
// (a BiasShape), which p.bias then reads: at batch or head 0 where the table has size 1 (a bias
// broadcast by size).
std::vector<double> numeric_bias_gradient(ReferenceProblem p, Inputs in,
                                          kiln::test::BiasShape shape) {
  std::vector<double> table(shape.count());
  for (std::size_t b = 0; b < shape.batch; ++b) {
    for (std::size_t h = 0; h < shape.heads; ++h) {
      for (std::size_t i = 0; i < shape.seqlen_q; ++i) {
        for (std::size_t j = 0; j < shape.seqlen_k; ++j) {
          table[shape.at(b, h, i, j)] = p.bias(static_cast<int>(b), static_cast<int>(h),
                                               static_cast<int>(i), static_cast<int>(j));
        }
      }
    }
  }
  p.bias = [&table, shape](int b, int h, int i, int j) {
    return table[shape.at(shape.batch == 1 ? 0 : static_cast<std::size_t>(b),
                          shape.heads == 1 ? 0 : static_cast<std::size_t>(h),
                          static_cast<std::size_t>(i), static_cast<std::size_t>(j))];
  };
  return numeric_gradient(p, in, table);
}

struct Mismatches {
  double dq = 0, dk = 0, dv = 0, dsinks = 0, dbias = 0;
  double max() const { return std::max({dq, dk, dv, dsinks, dbias}); }
};

// Each fp64 gradient of `got` against finite differences of the loss of `p` on `in`.
Mismatches check_against_numeric(ReferenceProblem p, Inputs in, const BackwardReference& got) {
  Mismatches m;
  m.dq = mismatch(numeric_gradient(p, in, in.q), got.dq.exact);
  m.dk = mismatch(numeric_gradient(p, in, in.k), got.dk.exact);
  m.dv = mismatch(numeric_gradient(p, in, in.v), got.dv.exact);
  if (!p.sinks.empty()) m.dsinks = mismatch(numeric_gradient(p, in, p.sinks), got.dsinks.exact);
  if (p.bias) {
    m.dbias = mismatch(numeric_bias_gradient(p, in, kiln::test::bias_shape(p)), got.dbias.exact);
  }
  INFO("relative mismatch dq " << m.dq << " dk " << m.dk << " dv " << m.dv << " dsinks " << m.dsinks
                               << " dbias " << m.dbias);
  CHECK(m.max() < kTolerance);
  return m;
}

// A small problem: 2 heads of dims 8 / 8, two padded sequences of 5 queries over 7 keys.
ReferenceProblem small_problem() {
  ReferenceProblem p;
  p.dtype = DType::bf16;
  p.heads = p.heads_kv = 2;
  p.head_dim = p.head_dim_v = 8;
  p.softmax_scale = 0.4;
  p.set_padded(2, 5, 7);
  return p;
}

// A random bias, (batch, head, row, key) up to 8 x heads x seqlen_q x seqlen_k.
std::function<double(int, int, int, int)> random_bias(std::mt19937& rng, int heads = 8,
                                                      int seqlen_q = 16, int seqlen_k = 16) {
  std::vector<double> values = kiln::test::random_normal(
      DType::bf16, static_cast<std::size_t>(8 * heads * seqlen_q * seqlen_k), rng);
  return [values, heads, seqlen_q, seqlen_k](int b, int h, int i, int j) {
    return values[static_cast<std::size_t>(((b * heads + h) * seqlen_q + i) * seqlen_k + j)];
  };
}

// A user variant's nonlinear logit hook and its derivative, of the coordinates too: a tanh cap
// of 1.5 + head on the logit times a gain of the query row and of the key.
double gain(int b, int i, int j) {
  return (1 + 0.25 * ((b + i) % 3)) * (0.5 + 0.125 * (j % 5));
}
double capped(int b, int h, int i, int j, double x) {
  const double cap = 1.5 + h;
  return cap * std::tanh(gain(b, i, j) * x / cap);
}
double capped_grad(int b, int h, int i, int j, double x) {
  const double g = gain(b, i, j), t = std::tanh(g * x / (1.5 + h));
  return g * (1 - t * t);
}

struct Feature {
  std::string name;
  std::function<void(ReferenceProblem&, std::mt19937&)> set;
};

// Each feature on top of small_problem(), and what of it finite differences see.
std::vector<Feature> features() {
  return {
      {"no mask", [](ReferenceProblem&, std::mt19937&) {}},
      {"causal bottom-right, more queries than keys: rows 0 and 1 see no key",
       [](ReferenceProblem& p, std::mt19937&) {
         p.set_padded(2, 6, 4);
         p.window_right = 0;
       }},
      {"window (2, 1) top-left",
       [](ReferenceProblem& p, std::mt19937&) {
         p.set_padded(2, 7, 9);
         p.window_left = 2;
         p.window_right = 1;
         p.top_left = true;
       }},
      {"window (1, -1) bottom-right",
       [](ReferenceProblem& p, std::mt19937&) { p.window_left = 1; }},
      {"GQA 4 / 2 with head_dim_v 12",
       [](ReferenceProblem& p, std::mt19937&) {
         p.heads = 4;
         p.head_dim_v = 12;
       }},
      {"MQA 3 / 1 causal",
       [](ReferenceProblem& p, std::mt19937&) {
         p.heads = 3;
         p.heads_kv = 1;
         p.window_right = 0;
       }},
      {"varlen with an empty sequence, seqused_k, causal",
       [](ReferenceProblem& p, std::mt19937&) {
         p.set_lengths({3, 0, 5, 2}, {4, 2, 6, 3});
         p.seqused_k = {2, 1, 6, 0};
         p.window_right = 0;
       }},
      {"softcap 2 at scale 1",
       [](ReferenceProblem& p, std::mt19937&) {
         p.softmax_scale = 1;
         p.softcap = 2;
       }},
      {"ALiBi per head",
       [](ReferenceProblem& p, std::mt19937&) {
         p.alibi_slopes = {0.5, 0.25};
       }},
      {"ALiBi per batch and head, causal top-left",
       [](ReferenceProblem& p, std::mt19937&) {
         p.alibi_slopes = {0.5, 0.25, 1.0, 0.125};
         p.window_right = 0;
         p.top_left = true;
       }},
      {"bias, with a row it masks entirely",
       [](ReferenceProblem& p, std::mt19937& rng) {
         p.bias = [values = random_bias(rng)](int b, int h, int i, int j) {
           return b == 1 && h == 0 && i == 2 ? -kInf : values(b, h, i, j);
         };
       }},
      {"sinks, one -inf, rows without keys, GQA",
       [](ReferenceProblem& p, std::mt19937& rng) {
         p.heads = 4;
         p.set_padded(2, 6, 4);
         p.window_right = 0;
         p.sinks = kiln::test::random_sinks(4, 4, rng);
       }},
      {"a nonlinear logit hook of the coordinates, over softcap and a bias",
       [](ReferenceProblem& p, std::mt19937& rng) {
         p.softmax_scale = 1;
         p.softcap = 3;
         p.bias = random_bias(rng);
         p.logit = capped;
         p.logit_grad = capped_grad;
       }},
      {"an additive logit hook that masks keys, and a row entirely, causal",
       [](ReferenceProblem& p, std::mt19937&) {
         p.window_right = 0;
         p.logit = [](int b, int h, int i, int j, double x) {
           return (b == 1 && i == 3) || (i + j + h) % 4 == 0 ? -kInf : x + 0.25 * (i - j);
         };
         p.logit_grad = [](int, int, int, int, double) { return 1.0; };
       }},
      {"everything at once",
       [](ReferenceProblem& p, std::mt19937& rng) {
         p.heads = 4;
         p.head_dim_v = 4;
         p.set_lengths({6, 3}, {5, 8});
         p.seqused_k = {4, 7};
         p.window_left = 3;
         p.window_right = 0;
         p.softmax_scale = 1;
         p.softcap = 3;
         p.alibi_slopes = {0.5, 0.25, 0.125, 1.0};
         p.bias = random_bias(rng);
         p.sinks = kiln::test::random_sinks(4, 4, rng);
         p.logit = capped;
         p.logit_grad = capped_grad;
       }},
  };
}

bool all_zero(const std::vector<double>& x, std::size_t from, std::size_t to) {
  return std::all_of(x.begin() + static_cast<std::ptrdiff_t>(from),
                     x.begin() + static_cast<std::ptrdiff_t>(to), [](double y) { return y == 0; });
}

}  // namespace

TEST_CASE("attention backward reference: fp64 gradients match finite differences per feature",
          "[attention_backward][reference]") {
  std::mt19937 rng(31);
  for (const Feature& feature : features()) {
    INFO(feature.name);
    ReferenceProblem p = small_problem();
    feature.set(p, rng);
    const Inputs in = random_inputs(p, rng);
    const BackwardReference r = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
    CHECK(r.dsinks.exact.size() == p.sinks.size());
    check_against_numeric(p, in, r);
  }
}

// A bias of size 1 over the batch or the heads is broadcast: its gradient is the full one summed
// over that dim (reduce_dbias), as finite differences of its smaller table say.
TEST_CASE("attention backward reference: a bias broadcast by size 1 gets the summed gradient",
          "[attention_backward][reference]") {
  std::mt19937 rng(35);
  const auto bias = random_bias(rng);
  for (auto [over_batch, over_heads] : {std::pair{true, false}, {false, true}, {true, true}}) {
    INFO("over the batch " << over_batch << ", over the heads " << over_heads);
    ReferenceProblem p = small_problem();
    p.heads = 4;
    p.window_right = 0;
    p.bias = [&bias, over_batch, over_heads](int b, int h, int i, int j) {
      return bias(over_batch ? 0 : b, over_heads ? 0 : h, i, j);
    };
    const Inputs in = random_inputs(p, rng);
    const BackwardReference r = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
    kiln::test::BiasShape shape = kiln::test::bias_shape(p);
    if (over_batch) shape.batch = 1;
    if (over_heads) shape.heads = 1;
    const kiln::test::GradientReference reduced =
        kiln::test::reduce_dbias(p, r.dbias, over_batch, over_heads);
    REQUIRE(reduced.exact.size() == shape.count());
    CHECK(mismatch(numeric_bias_gradient(p, in, shape), reduced.exact) < kTolerance);
    // The full gradient would not do: it is per (batch, head).
    CHECK(reduced.exact !=
          std::vector<double>(r.dbias.exact.begin(), r.dbias.exact.begin() + reduced.exact.size()));
  }
}

TEST_CASE("attention backward reference: rows that attend no key get zero gradients, no NaN",
          "[attention_backward][reference]") {
  std::mt19937 rng(32);
  // Causal bottom-right, 6 queries over 4 keys: queries 0 and 1 of each sequence see no key; a
  // sink gives them an lse but still no output, so no gradient either.
  ReferenceProblem p = small_problem();
  p.set_padded(2, 6, 4);
  p.window_right = 0;
  for (bool sinks : {false, true}) {
    INFO("sinks " << sinks);
    p.sinks = sinks ? std::vector<double>{0.5, 2.0} : std::vector<double>{};
    const Inputs in = random_inputs(p, rng);
    const BackwardReference r = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
    const std::size_t row = 2 * 8;  // heads * head_dim: one token of dq
    for (std::size_t b = 0; b < 2; ++b) {
      for (std::size_t h = 0; h < 2; ++h) {
        CHECK(r.keyless[(b * 6 + 1) * 2 + h]);
        CHECK_FALSE(r.keyless[(b * 6 + 2) * 2 + h]);
      }
      CHECK(all_zero(r.dq.exact, b * 6 * row, (b * 6 + 2) * row));
      CHECK(all_zero(r.dq.plain, b * 6 * row, (b * 6 + 2) * row));
      // Query 2 sees one key, whose weight 1 leaves dS = P (dP - D) = 0; query 3 sees two.
      CHECK_FALSE(all_zero(r.dq.exact, (b * 6 + 3) * row, (b * 6 + 4) * row));
    }
    for (const auto* g : {&r.dq, &r.dk, &r.dv, &r.dsinks}) {
      CHECK(
          std::all_of(g->exact.begin(), g->exact.end(), [](double x) { return std::isfinite(x); }));
      CHECK(
          std::all_of(g->plain.begin(), g->plain.end(), [](double x) { return std::isfinite(x); }));
    }
  }
  // Keys past seqused_k get no gradient.
  p = small_problem();
  p.seqused_k = {3, 7};
  const Inputs in = random_inputs(p, rng);
  const BackwardReference r = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
  CHECK(all_zero(r.dk.exact, 3 * 2 * 8, 7 * 2 * 8));
  CHECK(all_zero(r.dv.plain, 3 * 2 * 8, 7 * 2 * 8));
  CHECK_FALSE(all_zero(r.dk.exact, 7 * 2 * 8, 14 * 2 * 8));
}

// The finite-difference check has teeth: the gradients of a problem that leaves out one feature
// (or gets it a little wrong) fail it by orders of magnitude more than the tolerance.
TEST_CASE("attention backward reference: finite differences catch a wrong gradient",
          "[attention_backward][reference]") {
  std::mt19937 rng(33);
  ReferenceProblem p = small_problem();
  p.softmax_scale = 1;
  p.softcap = 2;
  p.alibi_slopes = {0.5, 0.25};
  p.bias = random_bias(rng);
  p.sinks = {1.0, 2.0};
  p.logit = capped;
  p.logit_grad = capped_grad;
  const Inputs in = random_inputs(p, rng);
  const BackwardReference right = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
  const Mismatches clean = check_against_numeric(p, in, right);
  CHECK(clean.max() < 1e-7);

  const std::vector<std::pair<const char*, std::function<void(ReferenceProblem&)>>> wrongs = {
      {"no softcap", [](ReferenceProblem& w) { w.softcap = 0; }},
      {"no ALiBi", [](ReferenceProblem& w) { w.alibi_slopes.clear(); }},
      {"no bias", [](ReferenceProblem& w) { w.bias = nullptr; }},
      {"a sink 1% off", [](ReferenceProblem& w) { w.sinks[1] *= 1.01; }},
      {"a scale 0.1% off", [](ReferenceProblem& w) { w.softmax_scale *= 1.001; }},
      {"the logit hook's derivative taken as 1",
       [](ReferenceProblem& w) { w.logit_grad = [](int, int, int, int, double) { return 1.0; }; }},
      {"the logit hook's derivative at the logit it returns",
       [](ReferenceProblem& w) {
         w.logit_grad = [](int b, int h, int i, int j, double x) {
           return capped_grad(b, h, i, j, capped(b, h, i, j, x));
         };
       }},
  };
  for (const auto& [name, make_wrong] : wrongs) {
    INFO(name);
    ReferenceProblem wrong = p;
    make_wrong(wrong);
    const BackwardReference r = attention_backward_reference(wrong, in.q, in.k, in.v, in.dout);
    Mismatches m;
    ReferenceProblem probe = p;
    Inputs at = in;
    m.dq = mismatch(numeric_gradient(probe, at, at.q), r.dq.exact);
    m.dk = mismatch(numeric_gradient(probe, at, at.k), r.dk.exact);
    m.dsinks = mismatch(numeric_gradient(probe, at, probe.sinks), r.dsinks.exact);
    if (r.dbias.exact.empty()) {
      CHECK(m.max() > 100 * kTolerance);
    } else {
      // The bias's gradient alone shows it too.
      m.dbias =
          mismatch(numeric_bias_gradient(probe, at, kiln::test::bias_shape(p)), r.dbias.exact);
      INFO("dbias mismatch " << m.dbias);
      CHECK(m.dbias > 100 * kTolerance);
    }
  }
  // One element of dk off by 1e-5 of the largest: over the tolerance.
  std::vector<double> off = right.dk.exact;
  double largest = 0;
  for (double x : off) largest = std::max(largest, std::fabs(x));
  off[5] += 1e-5 * largest;
  ReferenceProblem probe = p;
  Inputs at = in;
  CHECK(mismatch(numeric_gradient(probe, at, at.k), off) > kTolerance);
}

// FlashAttention's rule bounds kiln by twice the plain-dtype computation's error: that error must
// be small but not zero for every gradient, in bf16 and f16, or the rule would say nothing (or
// nothing would pass).
TEST_CASE("attention backward reference: the plain-dtype gradients are a little off fp64",
          "[attention_backward][reference]") {
  std::mt19937 rng(34);
  for (DType dtype : {DType::bf16, DType::f16}) {
    INFO(kiln::to_string(dtype));
    ReferenceProblem p;
    p.dtype = dtype;
    p.heads = 4;
    p.heads_kv = 2;
    p.head_dim = p.head_dim_v = 64;
    p.softmax_scale = 0.125;
    p.softcap = 5;
    p.set_padded(1, 33, 47);
    p.sinks = {1.0, 2.0, 3.0, -kInf};
    p.bias = random_bias(rng, 4, 33, 47);
    const Inputs in = random_inputs(p, rng);
    const BackwardReference r = attention_backward_reference(p, in.q, in.k, in.v, in.dout);
    const auto stored = [&](double x) { return kiln::test::round_to(dtype, x) == x; };
    // dbias also summed over the heads, as a bias of size 1 there gets it.
    const kiln::test::GradientReference dbias_heads =
        kiln::test::reduce_dbias(p, r.dbias, false, true);
    const std::pair<const char*, const kiln::test::GradientReference*> grads[] = {
        {"dq", &r.dq},         {"dk", &r.dk},       {"dv", &r.dv},
        {"dsinks", &r.dsinks}, {"dbias", &r.dbias}, {"dbias summed over the heads", &dbias_heads}};
    for (const auto& [name, g] : grads) {
      INFO(name);
      const bool dsinks = g == &r.dsinks;
      if (!dsinks) CHECK(std::all_of(g->plain.begin(), g->plain.end(), stored));
      double largest = 0;
      for (double x : g->exact) largest = std::max(largest, std::fabs(x));
      kiln::test::ErrorReport report = kiln::test::compare_values(g->exact, g->exact, g->plain);
      INFO("baseline error " << report.baseline_error << " of gradients up to " << largest);
      CHECK(report.ok());
      CHECK(report.max_error == 0.0);
      CHECK(report.baseline_error > 1e-4 * largest);
      CHECK(report.baseline_error < 0.05 * largest);
      // An error just over the bound fails, as does a NaN.
      std::vector<double> off = g->exact;
      off[1] += 1.01 * report.bound();
      report = kiln::test::compare_values(off, g->exact, g->plain);
      CHECK_FALSE(report.ok());
      CHECK(report.worst == 1);
      off[2] = std::nan("");
      CHECK(kiln::test::compare_values(off, g->exact, g->plain).first_not_finite == 2);
    }
    // The head with a -inf sink has none to learn.
    CHECK(r.dsinks.exact[3] == 0.0);
    CHECK(r.dsinks.plain[3] == 0.0);
  }
}
