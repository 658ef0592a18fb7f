// SPDX-License-Identifier: Apache-2.0
// Non-finite inputs on the GPU: a NaN attention sink makes its head's rows NaN, out and LSE, in
// every prefill kernel and in decode, split or not, as the reference softmax it joins does; a NaN
// state makes a merge NaN, even beside empty ones. Other heads and tokens are untouched: they
// match a run whose sink is finite, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu.hpp"
#include "kiln/attention.hpp"
#include "kiln/decode.hpp"
#include "ops/attention_reference.hpp"
#include "support.hpp"

namespace {

using kiln::AttentionConfig;
using kiln::AttentionKernel;
using kiln::DType;
using kiln::TensorView;
using kiln::test::DeviceBuffer;

constexpr int kHeads = 4;
constexpr int kHeadsKv = 2;
constexpr int kDim = 64;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Head 1's sink is `head1`; head 2 has none.
std::vector<float> sinks_with(float head1) {
  return {0.5f, head1, -kInf, 1.25f};
}

// A byte no kernel writes by accident that, unlike the usual poison, is not NaN: 0x3C3C in bf16
// and 0x3C3C3C3C in fp32 are finite, so a NaN read back was written.
constexpr unsigned char kFinitePoison = 0x3C;

std::unique_ptr<DeviceBuffer> random_bf16(std::size_t count, std::mt19937& rng) {
  std::vector<std::uint16_t> bits;
  for (double x : kiln::test::random_normal(DType::bf16, count, rng)) {
    bits.push_back(kiln::test::to_bits(DType::bf16, x));
  }
  return kiln::test::upload(bits);
}

// A fresh buffer of `bytes`, filled with kFinitePoison.
std::unique_ptr<DeviceBuffer> output(std::size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>(bytes);
  KILN_CUDA_CHECK(cudaMemset(buffer->get(), kFinitePoison, bytes));
  return buffer;
}

// What one run wrote: out as bf16 bits and lse, both with the query head as `head_of(index)`.
struct Written {
  std::vector<std::uint16_t> out;
  std::vector<float> lse;
};

// Head 1 is NaN everywhere in `nan_run`; every other element equals `finite_run`'s, which holds
// no NaN. `out_head` and `lse_head` give an element's query head.
template <class OutHead, class LseHead>
void check_nan_head(const Written& nan_run, const Written& finite_run, const OutHead& out_head,
                    const LseHead& lse_head) {
  int nan_out = 0, nan_lse = 0;
  for (std::size_t i = 0; i < nan_run.out.size(); ++i) {
    const double got = kiln::test::from_bits(DType::bf16, nan_run.out[i]);
    const double finite = kiln::test::from_bits(DType::bf16, finite_run.out[i]);
    REQUIRE_FALSE(std::isnan(finite));
    if (out_head(i) == 1) {
      nan_out += std::isnan(got) ? 1 : 0;
    } else if (nan_run.out[i] != finite_run.out[i]) {
      FAIL_CHECK("out element " << i << " (head " << out_head(i) << ") is " << got << ", not "
                                << finite);
    }
  }
  for (std::size_t i = 0; i < nan_run.lse.size(); ++i) {
    REQUIRE_FALSE(std::isnan(finite_run.lse[i]));
    if (lse_head(i) == 1) {
      nan_lse += std::isnan(nan_run.lse[i]) ? 1 : 0;
    } else if (std::memcmp(&nan_run.lse[i], &finite_run.lse[i], sizeof(float)) != 0) {
      FAIL_CHECK("lse " << i << " (head " << lse_head(i) << ") is " << nan_run.lse[i] << ", not "
                        << finite_run.lse[i]);
    }
  }
  CHECK(nan_out == static_cast<int>(nan_run.out.size()) / kHeads);
  CHECK(nan_lse == static_cast<int>(nan_run.lse.size()) / kHeads);
}

TEST_CASE("a NaN sink makes its head's rows NaN in every prefill kernel, masked rows too",
          "[gpu][sinks]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(kiln::test::isolated_options(dir.path()));
  // Bottom-right causal with more queries than keys: rows 0 .. 15 see no key, so only the sink.
  constexpr int kSeqQ = 40, kSeqK = 24;
  std::mt19937 rng(20261125);
  const auto q = random_bf16(std::size_t{kSeqQ} * kHeads * kDim, rng);
  const auto k = random_bf16(std::size_t{kSeqK} * kHeadsKv * kDim, rng);
  const auto v = random_bf16(std::size_t{kSeqK} * kHeadsKv * kDim, rng);

  const kiln::AttentionProblem problem{.head_dim = kDim, .head_dim_v = kDim, .band = true};
  std::vector<std::pair<const char*, AttentionConfig>> configs = {
      {"choose()'s", kiln::choose(problem, rt.target())},
      {"mma", kiln::choose(problem, "sm_80")},
      {"portable", kiln::choose(problem, "gfx90a")}};
  if (rt.target() == "sm_90a") {
    AttentionConfig wgmma = configs[0].second;
    wgmma.kernel = AttentionKernel::wgmma;
    if (wgmma.block_n == 176) wgmma.block_n = 128;
    configs.emplace_back("wgmma", wgmma);
  }

  const auto run = [&](const AttentionConfig& config, float head1) {
    const auto sinks = kiln::test::upload(sinks_with(head1));
    const auto out = output(std::size_t{kSeqQ} * kHeads * kDim * 2);
    const auto lse = output(std::size_t{kHeads} * kSeqQ * 4);
    kiln::AttentionOptions options;
    options.score.causal = true;
    options.score.sinks = TensorView::contiguous(sinks->get(), DType::f32, {kHeads});
    options.lse = TensorView::contiguous(lse->get(), DType::f32, {1, kHeads, kSeqQ});
    kiln::attention(TensorView::contiguous(q->get(), DType::bf16, {1, kSeqQ, kHeads, kDim}),
                    TensorView::contiguous(k->get(), DType::bf16, {1, kSeqK, kHeadsKv, kDim}),
                    TensorView::contiguous(v->get(), DType::bf16, {1, kSeqK, kHeadsKv, kDim}),
                    TensorView::contiguous(out->get(), DType::bf16, {1, kSeqQ, kHeads, kDim}),
                    options, config, nullptr, rt);
    kiln::test::sync_and_check();
    return Written{out->download<std::uint16_t>(), lse->download<float>()};
  };
  for (const auto& [name, config] : configs) {
    INFO(name << " kernel");
    const Written nan_run = run(config, std::numeric_limits<float>::quiet_NaN());
    const Written finite_run = run(config, 0.75f);
    check_nan_head(
        nan_run, finite_run, [](std::size_t i) { return static_cast<int>(i / kDim % kHeads); },
        [](std::size_t i) { return static_cast<int>(i / kSeqQ); });
    // The finite run wrote the masked rows: out 0 and lse the sink (head 0's 0.5; -inf without).
    CHECK(finite_run.lse[0] == 0.5f);
    CHECK(finite_run.lse[2 * kSeqQ] == -kInf);
    CHECK(kiln::test::from_bits(DType::bf16, finite_run.out[0]) == 0.0);
  }
}

TEST_CASE("a NaN sink makes its head's rows NaN in decode, split or not", "[gpu][sinks]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(kiln::test::isolated_options(dir.path()));
  constexpr int kBatch = 3, kSeqQ = 2, kCapacity = 300;
  std::mt19937 rng(1125);
  const auto q = random_bf16(std::size_t{kBatch} * kSeqQ * kHeads * kDim, rng);
  const auto k = random_bf16(std::size_t{kBatch} * kCapacity * kHeadsKv * kDim, rng);
  const auto v = random_bf16(std::size_t{kBatch} * kCapacity * kHeadsKv * kDim, rng);
  // The last sequence is empty: its rows see only the sink.
  const auto seqlens = kiln::test::upload(std::vector<std::int32_t>{kCapacity, 97, 0});

  const auto run = [&](int splits, float head1) {
    const auto sinks = kiln::test::upload(sinks_with(head1));
    const auto out = output(std::size_t{kBatch} * kSeqQ * kHeads * kDim * 2);
    const auto lse = output(std::size_t{kBatch} * kHeads * kSeqQ * 4);
    kiln::DecodeOptions options;
    options.num_splits = splits;
    options.score.sinks = TensorView::contiguous(sinks->get(), DType::f32, {kHeads});
    options.lse = TensorView::contiguous(lse->get(), DType::f32, {kBatch, kHeads, kSeqQ});
    const kiln::KVCache cache{
        .k = TensorView::contiguous(k->get(), DType::bf16, {kBatch, kCapacity, kHeadsKv, kDim}),
        .v = TensorView::contiguous(v->get(), DType::bf16, {kBatch, kCapacity, kHeadsKv, kDim}),
        .seqlens = TensorView::contiguous(seqlens->get(), DType::i32, {kBatch})};
    kiln::attention_with_kvcache(
        TensorView::contiguous(q->get(), DType::bf16, {kBatch, kSeqQ, kHeads, kDim}), cache,
        TensorView::contiguous(out->get(), DType::bf16, {kBatch, kSeqQ, kHeads, kDim}), options,
        nullptr, rt);
    kiln::test::sync_and_check();
    return Written{out->download<std::uint16_t>(), lse->download<float>()};
  };
  for (int splits : {1, 4}) {
    INFO(splits << " splits");
    check_nan_head(
        run(splits, std::numeric_limits<float>::quiet_NaN()), run(splits, 0.75f),
        [](std::size_t i) { return static_cast<int>(i / kDim % kHeads); },
        [](std::size_t i) { return static_cast<int>(i / kSeqQ % kHeads); });
  }
}

TEST_CASE("merging a NaN state gives NaN, beside empty states too", "[gpu][merge]") {
  KILN_REQUIRE_GPU();
  kiln::test::TempDir dir;
  kiln::Runtime rt(kiln::test::isolated_options(dir.path()));
  constexpr int kTokens = 3, kStates = 3;
  std::mt19937 rng(7);
  const auto v = random_bf16(std::size_t{kTokens} * kStates * kHeads * kDim, rng);
  // Head 1 of every token holds a NaN state; token 2's other states are empty (-inf).
  const auto run = [&](float nan_or_not) {
    std::vector<float> s;
    for (int t = 0; t < kTokens; ++t) {
      for (int state = 0; state < kStates; ++state) {
        for (int h = 0; h < kHeads; ++h) {
          const bool empty = t == 2 && state > 0;
          s.push_back(h == 1 && state == 0 ? nan_or_not
                      : empty              ? -kInf
                                           : 0.25f * static_cast<float>(state + h));
        }
      }
    }
    const auto lse_in = kiln::test::upload(s);
    const auto out = output(std::size_t{kTokens} * kHeads * kDim * 2);
    const auto lse = output(std::size_t{kTokens} * kHeads * 4);
    const TensorView lse_view = TensorView::contiguous(lse->get(), DType::f32, {kTokens, kHeads});
    kiln::merge_states(
        TensorView::contiguous(v->get(), DType::bf16, {kTokens, kStates, kHeads, kDim}),
        TensorView::contiguous(lse_in->get(), DType::f32, {kTokens, kStates, kHeads}),
        TensorView::contiguous(out->get(), DType::bf16, {kTokens, kHeads, kDim}), &lse_view,
        nullptr, rt);
    kiln::test::sync_and_check();
    return Written{out->download<std::uint16_t>(), lse->download<float>()};
  };
  check_nan_head(
      run(std::numeric_limits<float>::quiet_NaN()), run(1.5f),
      [](std::size_t i) { return static_cast<int>(i / kDim % kHeads); },
      [](std::size_t i) { return static_cast<int>(i % kHeads); });
}

}  // namespace
