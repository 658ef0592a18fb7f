// SPDX-License-Identifier: Apache-2.0
// The attention kernels' score model on its own: kernels_src/attention/core/logits.cuh's
// LogitTransform and band mask, run over one tile by probe kernels
// (tests/ops/kernels/probe/logits.cuh) in each shape the kernels hold it (prefill's fragments,
// decode's packed rows, the portable kernel's whole rows) and checked logit by logit against
// fp64, with the tile inside the sequence and overhanging it (rows past seqlen_q, keys past
// seqlen_k), where a variant's logits are discarded and its reads stay inside its tensors.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_reference.hpp"
#include "gpu.hpp"
#include "kiln/params/attention.h"
#include "kiln/runtime.hpp"
#include "support.hpp"

namespace {

namespace fs = std::filesystem;
using kiln::DType;
using kiln::test::DeviceBuffer;
using kiln::test::upload;

constexpr int kSTiles = 8;
constexpr int kKeys = 8 * kSTiles;
constexpr int kMTiles = 2;  // decode's packed rows: two m16 tiles
constexpr int kHeads = 6;
constexpr int kHeadsKv = 2;
constexpr int kGroup = kHeads / kHeadsKv;
constexpr double kLog2e = 1.4426950408889634;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A variant with each hook and per-row state, reading tensors by query and by key: exactly
// seqlen_q and seqlen_k floats, so that a read past either would be out of bounds (memcheck),
// but for variant_load's clamp. Past the sequence (scalars 1 and 2 are seqlen_q and seqlen_k),
// its logit is NaN and its mask keeps the key, so that a logit there that the kernel failed to
// discard would show; `row` and `sink`, which are promised rows inside the sequence, and every
// hook given a negative coordinate, set the flag in tensor 2.
const kiln::Variant& probe_variant() {
  static const kiln::Variant variant{.name = "probe", .code = R"(
struct kiln_variant {
  float row_value;
  static __device__ bool outside(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return at.query >= static_cast<int>(v.scalars[1]) || at.key >= static_cast<int>(v.scalars[2]);
  }
  static __device__ void flag_if(const kiln::VariantParams& v, bool wrong) {
    // NOTE: the flag's memory is the test's own, writable; VariantTensor only calls it const.
    if (wrong) *static_cast<unsigned*>(const_cast<void*>(v.tensors[2].data)) = 1;
  }
  static __device__ kiln_variant row(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    flag_if(v, at.query < 0 || at.key != -1 || outside(v, at));
    return {kiln::variant_load<float>(v.tensors[0], at.query)};
  }
  __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                         float x) const {
    flag_if(v, at.query < 0 || at.key < 0);
    if (outside(v, at)) return __int_as_float(0x7fc00000);
    return x + row_value * kiln::variant_load<float>(v.tensors[1], at.key) + v.scalars[0] * at.head;
  }
  __device__ bool mask(const kiln::VariantParams& v, const kiln::VariantCoords& at) const {
    flag_if(v, at.query < 0 || at.key < 0);
    return outside(v, at) || (at.query + at.key) % 7 != 3;
  }
  __device__ float sink(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                        float sink) const {
    flag_if(v, at.query < 0 || at.key != -1 || outside(v, at));
    return sink + row_value;
  }
};
)"};
  return variant;
}

// How the probe holds its tile, as a kernel family does (probe/logits.cuh).
enum class Shape { fragments, packed, row };

struct Probe {
  Shape shape = Shape::fragments;
  int window_left = -1;  // the band, as ScoreParams has it; causal is (-1, 0)
  int window_right = -1;
  bool top_left = false;
  float softcap = 0;
  bool alibi = false;
  bool bias = false;
  bool sinks = false;
  bool variant = false;
  int seqlen_q = 13;
  int seqlen_k = 45;
  int row_begin = 0;  // the tile's first row (packed: packed row) and key
  int key_begin = 0;

  bool band() const { return window_left >= 0 || window_right >= 0; }
  int rows() const { return shape == Shape::fragments ? 16 : 32; }
};

std::string describe(const Probe& c) {
  const char* shapes[] = {"fragments", "packed rows", "whole rows"};
  return fmt::format("{} seqlen {}x{} tile at ({}, {}) window ({}, {}){}{}{}{}{}{}",
                     shapes[static_cast<int>(c.shape)], c.seqlen_q, c.seqlen_k, c.row_begin,
                     c.key_begin, c.window_left, c.window_right, c.top_left ? " top-left" : "",
                     c.softcap > 0 ? " softcap" : "", c.alibi ? " alibi" : "",
                     c.bias ? " bias" : "", c.sinks ? " sinks" : "", c.variant ? " variant" : "");
}

kiln::KernelSpec probe_spec(const Probe& c) {
  const char* entries[] = {"probe::logits", "probe::packed_logits", "probe::row_logits"};
  kiln::KernelSpec spec{.source = "probe/logits.cuh",
                        .entry = entries[static_cast<int>(c.shape)],
                        .params = "kiln::AttentionParams"};
  spec.set("dtype_q", DType::bf16)
      .set("dtype_kv", DType::bf16)
      .set("band", c.band())
      .set("has_softcap", c.softcap > 0)
      .set("has_alibi", c.alibi)
      .set("s_tiles", kSTiles);
  // Decode's rows take no bias: its specs have no has_bias.
  if (c.shape == Shape::packed) {
    spec.set("m_tiles", kMTiles);
  } else {
    spec.set("has_bias", c.bias);
  }
  if (c.variant) {
    spec.variant_name = probe_variant().name;
    spec.variant_code = probe_variant().code;
  }
  return spec;
}

// kernels_src with the probe beside it, as a runtime's kernels_dir.
fs::path probe_kernels(const fs::path& dir) {
  const fs::path source(KILN_SOURCE_DIR);
  fs::copy(source / "kernels_src", dir, fs::copy_options::recursive);
  fs::copy(source / "tests" / "ops" / "kernels", dir, fs::copy_options::recursive);
  return dir;
}

const std::vector<Probe>& probes() {
  static const std::vector<Probe> all = [] {
    std::vector<Probe> v;
    // Overhanging rows and keys; inside; the tile's last key alone past the sequence. Packed rows
    // count queries times kGroup heads: 15, 60 and 48 of them.
    for (const Shape shape : {Shape::fragments, Shape::packed, Shape::row}) {
      const bool packed = shape == Shape::packed;
      for (const auto& [q, k, row, key] : {std::tuple{packed ? 5 : 13, 45, 0, 0},
                                           std::tuple{packed ? 20 : 100, 300, packed ? 16 : 32, 64},
                                           std::tuple{packed ? 16 : 48, 127, 16, 64}}) {
        const Probe at{
            .shape = shape, .seqlen_q = q, .seqlen_k = k, .row_begin = row, .key_begin = key};
        Probe c = at;
        v.push_back(c);  // no transform: the logits stay scores, the scale in to_log2
        c.window_right = 0;
        c.softcap = 5.f;
        c.alibi = true;
        c.bias = !packed;
        v.push_back(c);
        c = at;
        c.window_right = 0;
        c.sinks = true;
        c.variant = true;
        v.push_back(c);
        // Every feature, and a window top-left that cuts rows near the sequence's start on the
        // left and every tile on the right.
        c.window_left = 2;
        c.window_right = 60;
        c.top_left = true;
        c.softcap = 5.f;
        c.alibi = true;
        c.bias = !packed;
        v.push_back(c);
      }
    }
    return v;
  }();
  return all;
}

// A probe's random inputs: the tile's scores, per head ALiBi slopes and sinks, the variant's
// values per query and per key, and a bf16 bias (seqlen_q, seqlen_k).
struct ProbeInputs {
  std::vector<float> scores, slopes, head_sinks, row_values, key_values;
  std::vector<std::uint16_t> bias;
};

ProbeInputs random_inputs(const Probe& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_real_distribution<float> uniform(0.1f, 0.9f);
  ProbeInputs in;
  const auto fill = [&](std::vector<float>& values, int count, auto& distribution) {
    values.resize(static_cast<std::size_t>(count));
    for (float& x : values) x = distribution(rng);
  };
  fill(in.scores, c.rows() * kKeys, normal);
  fill(in.slopes, kHeads, uniform);
  fill(in.head_sinks, kHeads, normal);
  fill(in.row_values, c.seqlen_q, normal);
  fill(in.key_values, c.seqlen_k, normal);
  in.bias.resize(static_cast<std::size_t>(c.seqlen_q * c.seqlen_k));
  for (auto& b : in.bias) b = kiln::test::to_bits(DType::bf16, normal(rng));
  return in;
}

// The query and head of the tile's row r, or nullopt for a row past the sequence (a kernel
// never stores it): prefill's rows are queries of head kHeads - 1, decode's pack queries and the
// heads of kv head kHeadsKv - 1.
struct RowAt {
  int query;
  int head;
};
std::optional<RowAt> row_at(const Probe& c, int r) {
  const int row = c.row_begin + r;
  if (c.shape != Shape::packed) {
    if (row >= c.seqlen_q) return std::nullopt;
    return RowAt{row, kHeads - 1};
  }
  if (row >= c.seqlen_q * kGroup) return std::nullopt;
  return RowAt{row / kGroup, (kHeadsKv - 1) * kGroup + row % kGroup};
}

// In fp64, the logit of `score` at query i and key j of `head`: -inf where masked.
double want_logit(const Probe& c, const ProbeInputs& in, int head, int i, int j, double score) {
  const int offset = c.top_left ? 0 : c.seqlen_k - c.seqlen_q;
  double want = score * 0.37;
  if (c.softcap > 0) want = c.softcap * std::tanh(want / c.softcap);
  if (c.alibi) {
    want -=
        in.slopes[static_cast<std::size_t>(head)] * static_cast<double>(std::abs(i + offset - j));
  }
  if (j >= c.seqlen_k || (c.window_left >= 0 && j < i + offset - c.window_left) ||
      (c.window_right >= 0 && j > i + offset + c.window_right)) {
    return -kInf;
  }
  if (c.bias) {
    want +=
        kiln::test::from_bits(DType::bf16, in.bias[static_cast<std::size_t>(i * c.seqlen_k + j)]);
  }
  if (c.variant) {
    if ((i + j) % 7 == 3) return -kInf;
    want +=
        in.row_values[static_cast<std::size_t>(i)] * in.key_values[static_cast<std::size_t>(j)] +
        0.25 * head;
  }
  return want;
}

// In fp64, the sink of query i's row of `head`: -inf for none.
double want_sink(const Probe& c, const ProbeInputs& in, int head, int i) {
  double sink = c.sinks ? in.head_sinks[static_cast<std::size_t>(head)] : -kInf;
  if (c.variant) sink += in.row_values[static_cast<std::size_t>(i)];
  return sink;
}

TEST_CASE("the score model's probe compiles for sm_90a and sm_80", "[attention][compile]") {
  const kiln::test::TempDir cache, kernels;
  for (const char* target : {"sm_90a", "sm_80"}) {
    kiln::Options options = kiln::test::isolated_options(cache.path(), target);
    options.kernels_dir = probe_kernels(kernels.path() / target);
    kiln::Runtime rt(options);
    std::vector<kiln::KernelSpec> specs;
    for (const Probe& c : probes()) specs.push_back(probe_spec(c));
    const kiln::WarmupReport report = rt.warmup(specs, {.threads = 2, .load = false});
    for (const kiln::WarmupItem& item : report.items) {
      INFO(target << ": " << item.error);
      CHECK(item.status != kiln::WarmupStatus::failed);
    }
  }
}

TEST_CASE("the score model on one tile matches fp64, inside and overhanging the sequence",
          "[attention][gpu]") {
  KILN_REQUIRE_GPU();
  const kiln::test::TempDir cache, kernels;
  kiln::Options options = kiln::test::isolated_options(cache.path());
  options.kernels_dir = probe_kernels(kernels.path() / "src");
  kiln::Runtime rt(options);
  std::mt19937 rng(17);

  for (const Probe& c : probes()) {
    INFO(describe(c));
    const ProbeInputs in = random_inputs(c, rng);
    const auto d_scores = upload(in.scores);
    const auto d_slopes = upload(in.slopes);
    const auto d_sinks = upload(in.head_sinks);
    const auto d_rows = upload(in.row_values);
    const auto d_keys = upload(in.key_values);
    const auto d_bias = upload(in.bias);
    const auto d_flag = upload(std::vector<std::uint32_t>{0});
    DeviceBuffer d_out(in.scores.size() * sizeof(float));
    DeviceBuffer d_lse(static_cast<std::size_t>(c.rows() + 1) * sizeof(float));
    d_out.poison();
    d_lse.poison();

    kiln::AttentionParams p{};
    p.q = d_scores->get();
    p.out = d_out.get();
    p.q_seq_stride = c.row_begin;
    p.kv.k_seq_stride = c.key_begin;
    p.batch = 1;
    p.heads = kHeads;
    p.heads_kv = kHeadsKv;
    p.seqlen_q = c.seqlen_q;
    p.seqlen_k = c.seqlen_k;
    p.score.softmax_scale = 0.37f;
    p.score.window_left = c.window_left;
    p.score.window_right = c.window_right;
    p.score.top_left = c.top_left;
    p.score.softcap = c.softcap;
    p.score.maybe_alibi_slopes = c.alibi ? static_cast<const float*>(d_slopes->get()) : nullptr;
    p.score.maybe_sinks = c.sinks ? static_cast<const float*>(d_sinks->get()) : nullptr;
    p.score.variant.scalars[0] = 0.25f;
    p.score.variant.scalars[1] = static_cast<float>(c.seqlen_q);
    p.score.variant.scalars[2] = static_cast<float>(c.seqlen_k);
    p.score.variant.tensors[0] = {d_rows->get(), {1, 0, 0, 0}, {c.seqlen_q, 1, 1, 1}};
    p.score.variant.tensors[1] = {d_keys->get(), {1, 0, 0, 0}, {c.seqlen_k, 1, 1, 1}};
    p.score.variant.tensors[2] = {d_flag->get(), {0, 0, 0, 0}, {1, 1, 1, 1}};
    p.maybe_bias = d_bias->get();
    p.bias_row_stride = c.seqlen_k;
    p.bias_col_stride = 1;
    p.maybe_lse = static_cast<float*>(d_lse.get());
    rt.kernel(probe_spec(c)).launch({.grid = {1}, .block = {32}}, p);
    kiln::test::sync_and_check();
    const auto out = d_out.download<float>();
    const auto lse = d_lse.download<float>();
    const double to_log2 = lse[static_cast<std::size_t>(c.rows())];
    CHECK(to_log2 > 0);
    if (c.variant) CHECK(d_flag->download<std::uint32_t>()[0] == 0);

    int checked = 0;
    for (int r = 0; r < c.rows(); ++r) {
      const std::optional<RowAt> row = row_at(c, r);
      if (!row) continue;
      for (int t = 0; t < kKeys; ++t) {
        const int j = c.key_begin + t;
        INFO("row " << row->query << " head " << row->head << " key " << j);
        const std::size_t at = static_cast<std::size_t>(r * kKeys + t);
        const double want = want_logit(c, in, row->head, row->query, j, in.scores[at]);
        // In log2 units, as the softmax takes them.
        const double got = out[at] * to_log2;
        if (want == -kInf) {
          CHECK(got == -kInf);
        } else {
          // fp32 arithmetic; tanh.approx is off by up to 2^-10.9 of tanh, so softcap's share.
          CHECK(
              got ==
              Approx(want * kLog2e).epsilon(1e-5).margin(c.softcap > 0 ? 2e-3 * c.softcap : 1e-4));
        }
        ++checked;
      }
      CHECK(lse[static_cast<std::size_t>(r)] ==
            Approx(want_sink(c, in, row->head, row->query)).margin(1e-6));
    }
    CHECK(checked > 0);
  }
}

}  // namespace
