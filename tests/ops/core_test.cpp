// The attention kernels' score model on its own: kernels_src/attention/core/logits.cuh's
// LogitTransform and band mask, run over one tile of fragments by a probe kernel
// (tests/ops/kernels/probe/logits.cuh) and checked logit by logit against fp64, with the tile
// inside the sequence and overhanging it (rows past seqlen_q, keys past seqlen_k).
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
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

constexpr int kRows = 16;
constexpr int kSTiles = 8;
constexpr int kKeys = 8 * kSTiles;
constexpr double kLog2e = 1.4426950408889634;

// A variant with each hook and per-row state, reading tensors by query and by key: exactly
// seqlen_q and seqlen_k floats, so that a read past either is out of bounds (memcheck).
const kiln::Variant& probe_variant() {
  static const kiln::Variant variant{.name = "probe", .code = R"(
struct kiln_variant {
  float row_value;
  static __device__ kiln_variant row(const kiln::VariantParams& v, const kiln::VariantCoords& at) {
    return {kiln::variant_load<float>(v.tensors[0], at.query)};
  }
  __device__ float logit(const kiln::VariantParams& v, const kiln::VariantCoords& at,
                         float x) const {
    return x + row_value * kiln::variant_load<float>(v.tensors[1], at.key) + v.scalars[0] * at.head;
  }
  __device__ bool mask(const kiln::VariantParams&, const kiln::VariantCoords& at) const {
    return (at.query + at.key) % 7 != 3;
  }
  __device__ float sink(const kiln::VariantParams&, const kiln::VariantCoords&, float sink) const {
    return sink + row_value;
  }
};
)"};
  return variant;
}

struct Probe {
  bool causal = false;
  float softcap = 0;
  bool alibi = false;
  bool bias = false;
  bool sinks = false;
  bool variant = false;
  int seqlen_q = 13;
  int seqlen_k = 45;
  int row_begin = 0;  // the tile's first row and key
  int key_begin = 0;
};

std::string describe(const Probe& c) {
  return fmt::format("seqlen {}x{} tile at ({}, {}){}{}{}{}{}{}", c.seqlen_q, c.seqlen_k,
                     c.row_begin, c.key_begin, c.causal ? " causal" : "",
                     c.softcap > 0 ? " softcap" : "", c.alibi ? " alibi" : "",
                     c.bias ? " bias" : "", c.sinks ? " sinks" : "", c.variant ? " variant" : "");
}

kiln::KernelSpec probe_spec(const Probe& c) {
  kiln::KernelSpec spec{
      .source = "probe/logits.cuh", .entry = "probe::logits", .params = "kiln::AttentionParams"};
  spec.set("dtype", DType::bf16)
      .set("band", c.causal)
      .set("has_softcap", c.softcap > 0)
      .set("has_alibi", c.alibi)
      .set("has_bias", c.bias)
      .set("s_tiles", kSTiles);
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
    // Overhanging rows and keys; inside; the tile's last key alone past the sequence.
    for (const auto& [q, k, row, key] :
         {std::tuple{13, 45, 0, 0}, std::tuple{100, 300, 32, 64}, std::tuple{40, 127, 16, 64}}) {
      const Probe at{.seqlen_q = q, .seqlen_k = k, .row_begin = row, .key_begin = key};
      Probe c = at;
      v.push_back(c);  // no transform: the logits stay scores, the scale in to_log2
      c.causal = true;
      c.softcap = 5.f;
      c.alibi = true;
      c.bias = true;
      v.push_back(c);
      c = at;
      c.causal = true;
      c.sinks = true;
      c.variant = true;
      v.push_back(c);
    }
    return v;
  }();
  return all;
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
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_real_distribution<float> uniform(0.1f, 0.9f);
  constexpr int kHeads = 3;
  constexpr int kHead = kHeads - 1;  // the probe's

  for (const Probe& c : probes()) {
    INFO(describe(c));
    std::vector<float> scores(kRows * kKeys);
    for (float& x : scores) x = normal(rng);
    std::vector<float> slopes(kHeads), head_sinks(kHeads);
    for (float& x : slopes) x = uniform(rng);
    for (float& x : head_sinks) x = normal(rng);
    std::vector<float> row_values(static_cast<std::size_t>(c.seqlen_q));
    std::vector<float> key_values(static_cast<std::size_t>(c.seqlen_k));
    for (float& x : row_values) x = normal(rng);
    for (float& x : key_values) x = normal(rng);
    std::vector<std::uint16_t> bias(static_cast<std::size_t>(c.seqlen_q * c.seqlen_k));
    for (auto& b : bias) b = kiln::test::to_bits(DType::bf16, normal(rng));

    const auto d_scores = upload(scores);
    const auto d_slopes = upload(slopes);
    const auto d_sinks = upload(head_sinks);
    const auto d_rows = upload(row_values);
    const auto d_keys = upload(key_values);
    const auto d_bias = upload(bias);
    DeviceBuffer d_out(kRows * kKeys * sizeof(float));
    DeviceBuffer d_lse((kRows + 1) * sizeof(float));
    d_out.poison();
    d_lse.poison();

    kiln::AttentionParams p{};
    p.q = d_scores->get();
    p.out = d_out.get();
    p.q_seq_stride = c.row_begin;
    p.k_seq_stride = c.key_begin;
    p.batch = 1;
    p.heads = kHeads;
    p.heads_kv = 1;
    p.seqlen_q = c.seqlen_q;
    p.seqlen_k = c.seqlen_k;
    p.score.softmax_scale = 0.37f;
    p.score.window_left = -1;
    p.score.window_right = c.causal ? 0 : -1;
    p.score.softcap = c.softcap;
    p.score.maybe_alibi_slopes = c.alibi ? static_cast<const float*>(d_slopes->get()) : nullptr;
    p.score.maybe_sinks = c.sinks ? static_cast<const float*>(d_sinks->get()) : nullptr;
    p.score.variant.scalars[0] = 0.25f;
    p.score.variant.tensors[0] = {d_rows->get(), {1, 0, 0, 0}};
    p.score.variant.tensors[1] = {d_keys->get(), {1, 0, 0, 0}};
    p.maybe_bias = d_bias->get();
    p.bias_row_stride = c.seqlen_k;
    p.bias_col_stride = 1;
    p.maybe_lse = static_cast<float*>(d_lse.get());
    rt.kernel(probe_spec(c)).launch({.grid = {1}, .block = {32}}, p);
    kiln::test::sync_and_check();
    const auto out = d_out.download<float>();
    const auto lse = d_lse.download<float>();
    const double to_log2 = lse[kRows];
    CHECK(to_log2 > 0);

    const int offset = c.seqlen_k - c.seqlen_q;
    int checked = 0;
    for (int r = 0; r < kRows; ++r) {
      const int i = c.row_begin + r;
      if (i >= c.seqlen_q) continue;  // a row past the sequence: never stored by a kernel
      const double row_value = c.variant ? row_values[static_cast<std::size_t>(i)] : 0.0;
      for (int t = 0; t < kKeys; ++t) {
        const int j = c.key_begin + t;
        INFO("row " << i << " key " << j);
        double want = scores[static_cast<std::size_t>(r * kKeys + t)] * 0.37;
        if (c.softcap > 0) want = c.softcap * std::tanh(want / c.softcap);
        if (c.alibi) want -= slopes[kHead] * static_cast<double>(std::abs(i + offset - j));
        bool masked = j >= c.seqlen_k || (c.causal && j > i + offset);
        if (!masked && c.bias) {
          want += kiln::test::from_bits(DType::bf16,
                                        bias[static_cast<std::size_t>(i * c.seqlen_k + j)]);
        }
        if (!masked && c.variant) {
          want += row_value * key_values[static_cast<std::size_t>(j)] + 0.25 * kHead;
          masked = (i + j) % 7 == 3;
        }
        // In log2 units, as the softmax takes them.
        const double got = out[static_cast<std::size_t>(r * kKeys + t)] * to_log2;
        if (masked) {
          CHECK(got == -std::numeric_limits<double>::infinity());
        } else {
          // fp32 arithmetic; tanh.approx is off by up to 2^-10.9 of tanh, so softcap's share.
          CHECK(
              got ==
              Approx(want * kLog2e).epsilon(1e-5).margin(c.softcap > 0 ? 2e-3 * c.softcap : 1e-4));
        }
        ++checked;
      }
      double sink = c.sinks ? head_sinks[kHead] : -std::numeric_limits<double>::infinity();
      if (c.variant) sink += row_value;
      CHECK(lse[static_cast<std::size_t>(r)] == Approx(sink).margin(1e-6));
    }
    CHECK(checked > 0);
  }
}

}  // namespace
