// SPDX-License-Identifier: Apache-2.0
#include "variant_twins.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "variants.hpp"

namespace kiln::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log(e^a + e^b), -inf when both are.
double log_add(double a, double b) {
  const double top = std::max(a, b);
  return top == -kInf ? top : top + std::log(std::exp(a - top) + std::exp(b - top));
}

// The variant's code for row_sinks: each row's sink is log(e^head's + e^own), own from an fp32
// (batch, heads, seqlen_q) tensor, so every coordinate of a row is read.
const Variant& row_sinks_variant() {
  static const Variant variant{.name = "row_sinks", .code = R"(
struct kiln_variant {
  static __device__ float sink(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                               float sink) {
    const float own = kiln::variant_load<float>(v.tensors[0], at.batch, at.head, at.query);
    return fmaxf(sink, own) + log1pf(expf(-fabsf(sink - own)));
  }
};
)"};
  return variant;
}

std::vector<float> uniform_floats(std::size_t n, float low, float high, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(n);
  for (float& x : values) x = uniform(rng);
  return values;
}

// T5's bucket of relative distance `relative`, as t5_bias_variant's code takes it but in double;
// the logarithmic bucket's value must stay clear of a whole number, where float rounding on the
// GPU could land on the other side.
int t5_bucket(int relative, int buckets, int max_distance, bool bidirectional) {
  int base = 0;
  if (bidirectional) {
    buckets /= 2;
    if (relative > 0) base = buckets;
    relative = std::abs(relative);
  } else {
    relative = -std::min(relative, 0);
  }
  const int exact = buckets / 2;
  if (relative < exact) return base + relative;
  const double far = exact + std::log(static_cast<double>(relative) / exact) /
                                 std::log(static_cast<double>(max_distance) / exact) *
                                 (buckets - exact);
  // At relative == exact far is exactly `exact` on both sides (log 1 = 0); past `buckets` both
  // clamp.
  if (relative != exact && far < buckets) REQUIRE(std::abs(far - std::round(far)) > 1e-3);
  return base + std::min(static_cast<int>(far), buckets - 1);
}

std::vector<float> normal_floats(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> values(n);
  for (float& x : values) x = normal(rng);
  return values;
}

template <class T>
TensorView upload_view(const std::vector<T>& host, DType dtype,
                       std::initializer_list<std::int64_t> shape,
                       std::vector<std::unique_ptr<DeviceBuffer>>& buffers) {
  buffers.push_back(upload(host));
  return TensorView::contiguous(buffers.back()->get(), dtype, shape);
}

}  // namespace

const Variant& gated_cap_variant() {
  static const Variant variant{.name = "gated_cap", .code = R"(
struct kiln_variant {
  float cap, query_gain;
  static __device__ kiln_variant row(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return {kiln::variant_load<float>(v.tensors[0], at.head),
            kiln::variant_load<float>(v.tensors[1], at.batch, at.query)};
  }
  __device__ float gain(const kiln::VariantParams& v, const kiln::VariantCoords& at) const {
    return query_gain * kiln::variant_load<float>(v.tensors[2], at.batch, at.key);
  }
  __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                         float logit) const {
    return cap * tanhf(gain(v, at) * logit / cap);
  }
  __device__ float logit_grad(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                              float logit) const {
    const float g = gain(v, at);
    const float t = tanhf(g * logit / cap);
    return g * (1.f - t * t);
  }
};
)"};
  return variant;
}

std::string_view to_string(UserVariant variant) {
  switch (variant) {
    case UserVariant::none: return "none";
    case UserVariant::alibi: return "alibi";
    case UserVariant::document: return "document mask";
    case UserVariant::relative_bias: return "relative bias";
    case UserVariant::t5_bias: return "t5 bias";
    case UserVariant::key_padding: return "key padding";
    case UserVariant::softmax_one: return "softmax1";
    case UserVariant::row_sinks: return "row sinks";
    case UserVariant::gated_cap: return "gated cap";
  }
  return "?";
}

void add_user_variant(UserVariant variant, const VariantShape& shape, ReferenceProblem& ref,
                      ScoreOptions& score, std::vector<std::unique_ptr<DeviceBuffer>>& buffers,
                      std::mt19937& rng) {
  REQUIRE(shape.offsets.size() == static_cast<std::size_t>(shape.batch));
  // Each twin writes one of the reference's score terms, which must be unset; gated_cap writes
  // the logit hook alone, so it composes with the case's own ALiBi or bias.
  if (variant == UserVariant::gated_cap) {
    REQUIRE(!ref.logit);
  } else {
    REQUIRE((ref.alibi_slopes.empty() && !ref.bias && !ref.row_sink && !ref.logit));
  }
  const std::int64_t batch = shape.batch, heads = shape.heads;
  const std::int64_t seqlen_q = shape.seqlen_q, seqlen_k = shape.seqlen_k;
  const std::vector<int> offsets = shape.offsets;
  switch (variant) {
    case UserVariant::none: return;
    case UserVariant::alibi: {
      std::uniform_real_distribution<float> slope(0.05f, 1.0f);
      std::vector<float> slopes(static_cast<std::size_t>(heads));
      for (float& x : slopes) x = slope(rng);
      ref.alibi_slopes.assign(slopes.begin(), slopes.end());
      score.variant_tensors.push_back(upload_view(slopes, DType::f32, {heads}, buffers));
      score.variant = &examples::alibi_variant();
      return;
    }
    case UserVariant::document: {
      // Segments of 1 to 200 key positions; query row i is at position i + offset.
      std::uniform_int_distribution<int> length(1, 200);
      std::vector<int> segment;
      for (std::int64_t b = 0; b < batch; ++b) {
        int id = 0;
        for (std::int64_t left = 0; left < seqlen_k;) {
          const std::int64_t n = std::min<std::int64_t>(length(rng), seqlen_k - left);
          segment.insert(segment.end(), static_cast<std::size_t>(n), id++);
          left += n;
        }
        REQUIRE(offsets[static_cast<std::size_t>(b)] >= 0);
        REQUIRE(seqlen_q + offsets[static_cast<std::size_t>(b)] <= seqlen_k);
      }
      ref.bias = [segment, offsets, seqlen_k](int b, int, int i, int j) {
        const auto at = [&](int position) {
          return segment[static_cast<std::size_t>(b * seqlen_k + position)];
        };
        return at(i + offsets[static_cast<std::size_t>(b)]) == at(j) ? 0.0 : -kInf;
      };
      score.variant_tensors.push_back(upload_view(segment, DType::i32, {batch, seqlen_k}, buffers));
      score.variant = &examples::document_variant();
      return;
    }
    case UserVariant::relative_bias: {
      // A table of (heads, 2 * 16 + 1) biases, distances clamped to 16 either way.
      const int most = 16;
      const std::vector<float> table =
          normal_floats(static_cast<std::size_t>(heads * (2 * most + 1)), rng);
      ref.bias = [table, most, offsets](int b, int h, int i, int j) {
        const int distance = j - (i + offsets[static_cast<std::size_t>(b)]);
        return static_cast<double>(table[static_cast<std::size_t>(
            h * (2 * most + 1) + std::clamp(distance, -most, most) + most)]);
      };
      score.variant_tensors.push_back(
          upload_view(table, DType::f32, {heads, 2 * most + 1}, buffers));
      score.variant_scalars[0] = most;
      score.variant = &examples::relative_bias_variant();
      return;
    }
    case UserVariant::t5_bias: {
      // 32 buckets, bidirectional, out to 100 positions: no bucket edge lands on a whole number.
      const int buckets = 32, max_distance = 100;
      const std::vector<float> table =
          normal_floats(static_cast<std::size_t>(buckets * heads), rng);
      ref.bias = [table, heads, offsets](int b, int h, int i, int j) {
        const int relative = j - (i + offsets[static_cast<std::size_t>(b)]);
        const int bucket = t5_bucket(relative, buckets, max_distance, true);
        return static_cast<double>(table[static_cast<std::size_t>(bucket * heads + h)]);
      };
      score.variant_tensors.push_back(upload_view(table, DType::f32, {buckets, heads}, buffers));
      score.variant_scalars[0] = buckets;
      score.variant_scalars[1] = max_distance;
      score.variant_scalars[2] = 1;
      score.variant = &examples::t5_bias_variant();
      return;
    }
    case UserVariant::key_padding: {
      // About one key in four is padding, and the last sequence's are all padding.
      std::bernoulli_distribution keep(0.75);
      std::vector<std::int64_t> mask(static_cast<std::size_t>(batch * seqlen_k));
      for (std::size_t i = 0; i < mask.size(); ++i) {
        mask[i] = static_cast<std::int64_t>(i) / seqlen_k == batch - 1 ? 0 : keep(rng);
      }
      ref.bias = [mask, seqlen_k](int b, int, int, int j) {
        return mask[static_cast<std::size_t>(b * seqlen_k + j)] != 0 ? 0.0 : -kInf;
      };
      score.variant_tensors.push_back(upload_view(mask, DType::i64, {batch, seqlen_k}, buffers));
      score.variant = &examples::key_padding_variant();
      return;
    }
    case UserVariant::softmax_one:
      ref.row_sink = [](int, int, int, double sink) { return log_add(sink, 0.0); };
      score.variant = &examples::softmax_one_variant();
      return;
    case UserVariant::row_sinks: {
      // Around log(seqlen_k), so that the sink weighs about as much as the keys.
      std::vector<float> own =
          normal_floats(static_cast<std::size_t>(batch * heads * seqlen_q), rng);
      for (float& x : own) x += static_cast<float>(std::log(std::max<std::int64_t>(seqlen_k, 1)));
      ref.row_sink = [own, heads, seqlen_q](int b, int h, int i, double sink) {
        return log_add(sink, own[static_cast<std::size_t>((b * heads + h) * seqlen_q + i)]);
      };
      score.variant_tensors.push_back(
          upload_view(own, DType::f32, {batch, heads, seqlen_q}, buffers));
      score.variant = &row_sinks_variant();
      return;
    }
    case UserVariant::gated_cap: {
      // Caps of 2 to 4 over logits of std about 1 times gains of 0.25 to 2: tanh bends them.
      const std::vector<float> caps = uniform_floats(static_cast<std::size_t>(heads), 2, 4, rng);
      const std::vector<float> query_gains =
          uniform_floats(static_cast<std::size_t>(batch * seqlen_q), 0.5f, 2, rng);
      const std::vector<float> key_gains =
          uniform_floats(static_cast<std::size_t>(batch * seqlen_k), 0.5f, 1, rng);
      const auto gain = [=](int b, int i, int j) {
        return static_cast<double>(query_gains[static_cast<std::size_t>(b * seqlen_q + i)]) *
               key_gains[static_cast<std::size_t>(b * seqlen_k + j)];
      };
      ref.logit = [=](int b, int h, int i, int j, double x) {
        const double cap = caps[static_cast<std::size_t>(h)];
        return cap * std::tanh(gain(b, i, j) * x / cap);
      };
      ref.logit_grad = [=](int b, int h, int i, int j, double x) {
        const double g = gain(b, i, j), t = std::tanh(g * x / caps[static_cast<std::size_t>(h)]);
        return g * (1 - t * t);
      };
      score.variant_tensors.push_back(upload_view(caps, DType::f32, {heads}, buffers));
      score.variant_tensors.push_back(
          upload_view(query_gains, DType::f32, {batch, seqlen_q}, buffers));
      score.variant_tensors.push_back(
          upload_view(key_gains, DType::f32, {batch, seqlen_k}, buffers));
      score.variant = &gated_cap_variant();
      return;
    }
  }
}

}  // namespace kiln::test
