// SPDX-License-Identifier: Apache-2.0
// kiln::attention_backward() on a GPU against the fp64 backward reference, by FlashAttention's
// backward rule: the forward runs on the device for out and lse, then the backward with the
// config choose() picks and with explicit portable and mma ones, on random inputs with poisoned,
// guarded outputs; every forward feature, strided layouts, odd sizes, both dtypes, empty problems
// and determinism.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "attention_backward_reference.hpp"
#include "attention_case.hpp"
#include "attention_reference.hpp"
#include "gpu.hpp"
#include "gpu_harness.hpp"
#include "kiln/attention.hpp"
#include "kiln/attention_backward.hpp"
#include "kiln/error.hpp"
#include "kiln/variant.hpp"
#include "support.hpp"
#include "variant_twins.hpp"

namespace {

using kiln::DType;
using kiln::TensorView;
using kiln::test::Alibi;
using kiln::test::BackwardReference;
using kiln::test::Bias;
using kiln::test::Case;
using kiln::test::kDTypes;
using kiln::test::Layout;
using kiln::test::Output;
using kiln::test::Prepared;

// The configs every case runs with: choose()'s (none passed: on an H100 or H200 the wgmma
// kernels), a portable one of other tiles and 16 lanes on each key and row, an mma one of small
// tiles whose two warps a row group each take half of the head dims (choose() does that at 256
// only), and an mma one of large tiles, as choose() gives sm_80. NOTE: 16 x 64 with 4 warps put
// 2 lanes on a key, whose 16 chunks of a d256 row spilled 15 KB and made the suite's slowest case
// (run 31a).
using Config = std::optional<kiln::AttentionBackwardConfig>;
const Config kConfigs[] = {
    std::nullopt, kiln::AttentionBackwardConfig{.block_m = 16, .block_n = 16, .warps = 8},
    kiln::AttentionBackwardConfig{
        .block_m = 16, .block_n = 32, .warps = 4, .kernel = kiln::AttentionBackwardKernel::mma},
    kiln::AttentionBackwardConfig{
        .block_m = 64, .block_n = 64, .warps = 8, .kernel = kiln::AttentionBackwardKernel::mma}};

std::string describe(const Config& config) {
  if (!config) return "the config choose() picks";
  std::ostringstream s;
  s << (config->kernel == kiln::AttentionBackwardKernel::portable ? "portable"
        : config->kernel == kiln::AttentionBackwardKernel::mma    ? "mma"
                                                                  : "wgmma")
    << " block_m " << config->block_m << " block_n " << config->block_n << " warps "
    << config->warps;
  return s.str();
}

// A case's backward on the device: the forward's inputs and outputs (prepare()), dout in out's
// layout, the gradients' outputs in q's, k's and v's layouts (poisoned before each run), and
// the fp64 backward reference of the same inputs (run_forward's, which knows the stored out).
struct Backward {
  Prepared forward;
  std::vector<double> dout_values;
  TensorView dout;
  std::unique_ptr<Output> dq, dk, dv, dsinks, dbias;
  BackwardReference want;
};

// Where a case's bias broadcasts by size 1: dbias sums over those dims.
bool dbias_over_batch(const Case& c) {
  return c.bias == Bias::batch_size_one;
}
bool dbias_over_heads(const Case& c) {
  return c.bias == Bias::heads_size_one;
}

// dbias in the bias's shape: dense, with keys the rows of memory where the bias's are.
kiln::test::Strided dbias_layout(const Case& c) {
  const std::int64_t b = dbias_over_batch(c) ? 1 : c.batch, h = dbias_over_heads(c) ? 1 : c.heads;
  const std::int64_t sq = c.seqlen_q, sk = c.seqlen_k;
  if (c.bias == Bias::transposed) return {{b, h, sq, sk}, {h * sk * sq, sk * sq, 1, sq}, 0};
  return kiln::test::Strided::dense({b, h, sq, sk});
}

Backward prepare_backward(Case c, std::mt19937& rng) {
  c.lse = true;  // the backward takes the forward's lse
  Backward b{.forward = kiln::test::prepare(c, rng)};
  const kiln::test::Layouts l = kiln::test::layouts_of(c, b.forward.ref);
  b.dout_values = kiln::test::random_normal(c.dtype, l.out.count(), rng);
  std::vector<std::uint16_t> image(kiln::test::guarded_size({&l.out}), kiln::test::kPoison16);
  kiln::test::scatter(c.dtype, l.out, b.dout_values, image);
  b.forward.d.buffers.push_back(kiln::test::upload(image));
  b.dout = kiln::test::view_of(*b.forward.d.buffers.back(), c.dtype, l.out);
  b.dq = std::make_unique<Output>(c.dtype, l.q);
  b.dk = std::make_unique<Output>(c.dtype, l.k);
  b.dv = std::make_unique<Output>(c.dtype, l.v);
  if (c.score.sinks) {
    b.dsinks = std::make_unique<Output>(DType::f32, kiln::test::Strided::dense({c.heads}));
  }
  // dbias under gated_cap's nonlinear logit hook is refused (attention_compile_test).
  if (c.bias != Bias::none && c.score.variant != kiln::test::UserVariant::gated_cap) {
    b.dbias = std::make_unique<Output>(c.dtype, dbias_layout(c));
  }
  return b;
}

// The forward on the device, for the out and lse the backward takes (out checked on the way);
// then the reference, whose plain dsinks reads that out.
void run_forward(kiln::Runtime& rt, const Case& c, Backward& b) {
  kiln::test::DeviceCase& d = b.forward.d;
  d.out->poison();
  d.lse->poison();
  kiln::attention(d.q, d.k, d.v, d.out->view(), d.options, nullptr, rt);
  kiln::test::sync_and_check();
  const std::vector<std::uint8_t> out = d.out->bytes();
  kiln::test::check_out(*d.out, out, b.forward.want, c.heads, c.dim_v());
  CHECK(d.lse->written_outside(d.lse->bytes()) == 0);
  const Prepared& f = b.forward;
  b.want = kiln::test::attention_backward_reference(f.ref, f.q, f.k, f.v, b.dout_values,
                                                    d.out->values(out));
}

// What one backward run left in the gradients' buffers.
struct Grads {
  std::vector<std::uint8_t> dq, dk, dv, dsinks, dbias;
  bool operator==(const Grads&) const = default;
};

// The backward with `config`, or choose()'s when there is none, on freshly poisoned outputs.
Grads run_backward(kiln::Runtime& rt, Backward& b, const Config& config,
                   bool deterministic = false) {
  const kiln::test::DeviceCase& d = b.forward.d;
  kiln::AttentionGradOptions grads{.deterministic = deterministic};
  for (Output* o : {b.dq.get(), b.dk.get(), b.dv.get(), b.dsinks.get(), b.dbias.get()}) {
    if (o) o->poison();
  }
  if (b.dsinks) grads.dsinks = b.dsinks->view();
  if (b.dbias) grads.dbias = b.dbias->view();
  const TensorView out = d.out->view();
  if (config) {
    kiln::attention_backward(d.q, d.k, d.v, out, b.dout, b.dq->view(), b.dk->view(), b.dv->view(),
                             d.options, grads, *config, nullptr, rt);
  } else {
    kiln::attention_backward(d.q, d.k, d.v, out, b.dout, b.dq->view(), b.dk->view(), b.dv->view(),
                             d.options, grads, nullptr, rt);
  }
  kiln::test::sync_and_check();
  return {b.dq->bytes(), b.dk->bytes(), b.dv->bytes(),
          b.dsinks ? b.dsinks->bytes() : std::vector<std::uint8_t>{},
          b.dbias ? b.dbias->bytes() : std::vector<std::uint8_t>{}};
}

// Each gradient against the reference by the rule, nothing written outside it, and a dq of
// exactly 0 on the rows that attend no key.
void check_grads(const Case& c, const Backward& b, const Grads& got) {
  {
    INFO("dq");
    kiln::test::check_values(*b.dq, got.dq, b.want.dq.exact, b.want.dq.plain, c.heads, c.head_dim);
    const std::vector<double> dq = b.dq->values(got.dq);
    std::int64_t nonzero = 0;
    const auto dim = static_cast<std::size_t>(c.head_dim);
    for (std::size_t row = 0; row < b.want.keyless.size(); ++row) {
      if (!b.want.keyless[row]) continue;
      nonzero += std::count_if(dq.begin() + static_cast<std::ptrdiff_t>(row * dim),
                               dq.begin() + static_cast<std::ptrdiff_t>((row + 1) * dim),
                               [](double x) { return x != 0; });
    }
    INFO("elements of dq not 0 on rows that attend no key");
    CHECK(nonzero == 0);
  }
  {
    INFO("dk");
    kiln::test::check_values(*b.dk, got.dk, b.want.dk.exact, b.want.dk.plain, c.heads_kv,
                             c.head_dim);
  }
  {
    INFO("dv");
    kiln::test::check_values(*b.dv, got.dv, b.want.dv.exact, b.want.dv.plain, c.heads_kv,
                             c.dim_v());
  }
  if (b.dsinks) {
    INFO("dsinks");
    kiln::test::check_values(*b.dsinks, got.dsinks, b.want.dsinks.exact, b.want.dsinks.plain,
                             c.heads, 1);
  }
  if (b.dbias) {
    // Explained as (tokens, heads, dim): "token" is batch * heads + head, "head" the query row
    // and "col" the key.
    INFO("dbias");
    const kiln::test::GradientReference want = kiln::test::reduce_dbias(
        b.forward.ref, b.want.dbias, dbias_over_batch(c), dbias_over_heads(c));
    kiln::test::check_values(*b.dbias, got.dbias, want.exact, want.plain, c.seqlen_q, c.seqlen_k);
  }
}

// Runs `c`: the forward on the device, then the backward with each of kConfigs, each checked
// against one fp64 reference.
void run_case(kiln::Runtime& rt, const Case& c, std::mt19937& rng) {
  INFO(describe(c));
  Backward b = prepare_backward(c, rng);
  run_forward(rt, c, b);
  for (const Config& config : kConfigs) {
    INFO(describe(config));
    check_grads(c, b, run_backward(rt, b, config));
  }
}

}  // namespace

TEST_CASE("attention backward matches the reference at odd sequence lengths",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(1);
  for (DType dtype : kDTypes) {
    for (auto [sq, sk] :
         {std::pair{1, 1}, {17, 17}, {113, 203}, {256, 256}, {511, 129}, {1, 300}}) {
      for (bool causal : {false, true}) {
        run_case(rt,
                 {.dtype = dtype,
                  .batch = 2,
                  .seqlen_q = sq,
                  .seqlen_k = sk,
                  .heads = 2,
                  .heads_kv = 2,
                  .score = {.causal = causal}},
                 rng);
      }
    }
  }
}

TEST_CASE("attention backward for every head dim, and head_dim_v != head_dim",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(2);
  for (int dim : {32, 40, 64, 72, 128, 256}) {
    // Each dim compiles its own kernels: bf16 without a mask, f16 causal with GQA.
    run_case(
        rt,
        {.batch = 2, .seqlen_q = 113, .seqlen_k = 203, .heads = 2, .heads_kv = 2, .head_dim = dim},
        rng);
    run_case(rt,
             {.dtype = DType::f16,
              .batch = 1,
              .seqlen_q = 203,
              .seqlen_k = 113,
              .heads = 2,
              .heads_kv = 1,
              .head_dim = dim,
              .score = {.causal = true}},
             rng);
  }
  for (DType dtype : kDTypes) {
    for (auto [dim, dim_v] : {std::pair{64, 128}, {128, 64}, {192, 128}}) {
      run_case(rt,
               {.dtype = dtype,
                .batch = 2,
                .seqlen_q = 113,
                .seqlen_k = 203,
                .heads = 4,
                .heads_kv = 2,
                .head_dim = dim,
                .head_dim_v = dim_v,
                .score = {.causal = dim == 64}},
               rng);
    }
  }
}

TEST_CASE("attention backward masks: causal both ways, sliding windows, fully masked rows",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(3);
  struct Mask {
    bool causal;
    int left, right;
    bool top_left;
  };
  const Mask masks[] = {{true, -1, -1, false}, {true, -1, -1, true},  {false, 32, 0, false},
                        {false, 16, 8, false}, {false, 0, 0, false},  {false, 16, 8, true},
                        {false, -1, 5, false}, {false, 7, -1, false}, {true, 20, -1, true}};
  for (DType dtype : kDTypes) {
    // 203 x 113 bottom-right leaves the first 90 rows of a causal mask without keys (dq 0); a
    // window top-left on 113 x 203 leaves keys no row sees (dk and dv 0), and on 203 x 113 rows
    // past the keys' reach without any.
    for (auto [sq, sk] : {std::pair{113, 203}, {203, 113}, {17, 17}}) {
      for (const Mask& m : masks) {
        run_case(rt,
                 {.dtype = dtype,
                  .batch = 2,
                  .seqlen_q = sq,
                  .seqlen_k = sk,
                  .heads = 2,
                  .heads_kv = 1,
                  .score = {.causal = m.causal,
                            .window_left = m.left,
                            .window_right = m.right,
                            .top_left = m.top_left}},
                 rng);
      }
    }
  }
  run_case(rt, {.seqlen_q = 511, .seqlen_k = 512, .score = {.window_left = 64, .window_right = 0}},
           rng);
}

TEST_CASE("attention backward GQA and MQA: dk and dv summed over each group",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(4);
  for (auto [heads, heads_kv] : {std::pair{8, 2}, {6, 3}, {8, 1}}) {
    for (DType dtype : kDTypes) {
      run_case(rt,
               {.dtype = dtype,
                .batch = 2,
                .seqlen_q = 113,
                .seqlen_k = 203,
                .heads = heads,
                .heads_kv = heads_kv,
                .score = {.causal = dtype == DType::f16}},
               rng);
    }
    run_case(
        rt,
        {.seqlen_q = 17, .seqlen_k = 511, .heads = heads, .heads_kv = heads_kv, .head_dim = 128},
        rng);
  }
}

TEST_CASE("attention backward softcap, through tanh's derivative", "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(6);
  for (DType dtype : kDTypes) {
    // Logits of std 1 barely reach a cap of 30: cap them at 2, or raise the scale to 1 (std 8)
    // under a cap of 10, so that tanh matters.
    Case c{.dtype = dtype, .batch = 2, .seqlen_q = 113, .seqlen_k = 203, .score = {.softcap = 2}};
    run_case(rt, c, rng);
    c.seqlen_q = 203;
    c.seqlen_k = 113;
    c.heads = 4;
    c.score.causal = true;
    c.score.softcap = 10;
    c.score.softmax_scale = 1.0f;
    run_case(rt, c, rng);
  }
}

TEST_CASE("attention backward ALiBi slopes per head and per batch and head",
          "[gpu][attention_backward]") {
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
               .score = {.alibi = alibi}};
        run_case(rt, c, rng);
        // Distances from the diagonal change with the alignment.
        c.score.causal = true;
        c.score.top_left = sq > sk;
        run_case(rt, c, rng);
      }
    }
  }
}

// dbias takes the bias's shape: summed over the batch or heads where the bias has size 1 there,
// every element its own where it broadcasts by stride 0; 0 outside the band.
TEST_CASE("attention backward with the forward's additive bias: full, broadcast, transposed",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(8);
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype, .batch = 2, .seqlen_q = 113, .seqlen_k = 203, .heads = 4, .heads_kv = 4};
    for (Bias bias : {Bias::full, Bias::batch_broadcast, Bias::head_broadcast, Bias::transposed,
                      Bias::batch_size_one, Bias::heads_size_one}) {
      c.bias = bias;
      run_case(rt, c, rng);
    }
    // Causal with more queries than keys (rows without keys) under MQA; then with a softcap,
    // which the bias joins after, and seqused_k.
    c.seqlen_q = 203;
    c.seqlen_k = 113;
    c.heads_kv = 1;
    c.score.causal = true;
    for (Bias bias : {Bias::transposed, Bias::heads_size_one}) {
      c.bias = bias;
      run_case(rt, c, rng);
    }
    c.score = {.window_left = 40, .softcap = 2};
    c.bias = Bias::batch_size_one;
    c.seqused_k = {100, 113};
    run_case(rt, c, rng);
  }
}

// dq, dk and dv take q's, k's and v's layouts, dout out's: gaps (NaN in the inputs) are neither
// read nor written.
TEST_CASE("attention backward reads and writes strided layouts: packed QKV, BHSD, padded",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(5);
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype,
           .batch = 2,
           .seqlen_q = 113,
           .seqlen_k = 113,
           .heads = 4,
           .heads_kv = 4,
           .score = {.causal = true},
           .layout = Layout::packed_qkv};
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
  for (Layout layout : {Layout::padded, Layout::bhsd}) {
    run_case(rt,
             {.heads = 4,
              .heads_kv = 2,
              .head_dim = 72,
              .layout = layout,
              .seqlens_q = {113, 0, 17},
              .seqlens_k = {203, 64, 1}},
             rng);
  }
}

TEST_CASE("attention backward varlen: cu_seqlens with empty sequences, seqused_k",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(9);
  for (DType dtype : kDTypes) {
    // Sequence 2 has queries but no keys (dq 0), sequence 1 keys but no queries (dk, dv 0).
    Case c{.dtype = dtype,
           .heads = 4,
           .heads_kv = 2,
           .seqlens_q = {113, 0, 17, 203, 1},
           .seqlens_k = {203, 64, 0, 113, 1}};
    run_case(rt, c, rng);
    c.score.causal = true;
    run_case(rt, c, rng);
    c.score.causal = false;
    c.score.window_left = 16;
    c.score.window_right = 8;
    run_case(rt, c, rng);
    // seqused_k trims keys (the rest get dk and dv 0), and the bottom-right diagonal moves.
    c.score = {.causal = true};
    c.seqused_k = {150, 3, 0, 113, 0};
    run_case(rt, c, rng);
  }
  // seqused_k on a padded batch.
  run_case(rt, {.batch = 3, .seqlen_q = 113, .seqlen_k = 203, .seqused_k = {203, 57, 0}}, rng);
}

// Sinks under each mask (rows without keys included), with GQA, varlen and ALiBi; dsinks is fp32
// (heads), summed over batch and rows. random_sinks gives the last head of 3 or more none (-inf),
// whose dsinks is 0.
TEST_CASE("attention backward sinks and dsinks", "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(17);
  for (DType dtype : kDTypes) {
    run_case(rt,
             {.dtype = dtype,
              .batch = 2,
              .seqlen_q = 150,
              .seqlen_k = 300,
              .heads = 4,
              .heads_kv = 2,
              .score = {.sinks = true}},
             rng);
  }
  for (int dim : {64, 128, 256}) {
    // Causal with more queries than keys: the first rows see no key.
    run_case(rt,
             {.seqlen_q = 200,
              .seqlen_k = 70,
              .heads = 3,
              .heads_kv = 1,
              .head_dim = dim,
              .score = {.causal = true, .sinks = true}},
             rng);
  }
  // A sliding window, top-left, with ALiBi.
  run_case(rt,
           {.dtype = DType::f16,
            .batch = 2,
            .seqlen_q = 257,
            .seqlen_k = 257,
            .heads = 4,
            .heads_kv = 4,
            .score = {.causal = true,
                      .window_left = 31,
                      .top_left = true,
                      .alibi = Alibi::per_head,
                      .sinks = true}},
           rng);
  // Varlen with an empty sequence and a sequence without keys.
  run_case(rt,
           {.heads = 8,
            .heads_kv = 2,
            .score = {.causal = true, .sinks = true},
            .seqlens_q = {1, 0, 130, 64},
            .seqlens_k = {300, 5, 0, 64}},
           rng);
}

TEST_CASE("attention backward with every feature at once", "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(18);
  for (DType dtype : kDTypes) {
    run_case(rt,
             {.dtype = dtype,
              .batch = 2,
              .seqlen_q = 203,
              .seqlen_k = 113,
              .heads = 4,
              .heads_kv = 2,
              .head_dim = 96,
              .head_dim_v = 64,
              .score = {.causal = true,
                        .window_left = 40,
                        .softcap = 5,
                        .softmax_scale = 0.5f,
                        .alibi = Alibi::per_batch_head,
                        .sinks = true},
              .bias = Bias::full,
              .seqused_k = {100, 113}},
             rng);
  }
}

// Empty problems: no error, and nothing written where there is nothing to write; where keys or
// queries remain, their gradients are 0 (dk and dv of keys no query sees, dq of rows without
// keys), as the reference says.
TEST_CASE("attention backward with nothing to compute: batch 0, seqlen 0, no keys",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(11);
  for (bool sinks : {false, true}) {
    Case c{.batch = 0, .seqlen_q = 17, .seqlen_k = 17, .score = {.sinks = sinks}};
    run_case(rt, c, rng);
    c.batch = 2;
    c.seqlen_q = c.seqlen_k = 0;
    run_case(rt, c, rng);
    c.seqlen_k = 17;
    run_case(rt, c, rng);
    c.seqlen_q = 17;
    c.seqlen_k = 0;
    run_case(rt, c, rng);
    c.score.causal = true;
    run_case(rt, c, rng);
  }
  run_case(rt, {.seqlens_q = {0, 0}, .seqlens_k = {5, 0}}, rng);
  run_case(rt, {.seqlens_q = {0, 0}, .seqlens_k = {0, 0}}, rng);
}

// deterministic = true: two runs give the same bits, where an atomic dq or a split reduction
// would differ (GQA's summed dk and dv, varlen, head dims 128 and 256); the gradients pass the
// rule too.
TEST_CASE("attention backward is bitwise reproducible with deterministic = true",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(12);
  const Case cases[] = {
      {.batch = 2,
       .seqlen_q = 511,
       .seqlen_k = 512,
       .heads = 8,
       .heads_kv = 1,
       .score = {.causal = true}},
      {.dtype = DType::f16,
       .heads = 4,
       .heads_kv = 2,
       .score = {.sinks = true},
       .seqlens_q = {300, 0, 17, 200},
       .seqlens_k = {128, 64, 1, 511}},
      {.batch = 2, .seqlen_q = 256, .seqlen_k = 256, .heads = 4, .heads_kv = 2, .head_dim = 256},
      // Head dim 128 with a window: on sm_90a choose() gives the wgmma kernel, whose dq additions
      // take turns (at 64 on one warpgroup, at 256 on two that split the head dims).
      {.batch = 2,
       .seqlen_q = 300,
       .seqlen_k = 517,
       .heads = 4,
       .heads_kv = 2,
       .head_dim = 128,
       .score = {.causal = true, .window_left = 200}},
  };
  for (const Case& c : cases) {
    INFO(describe(c));
    Backward b = prepare_backward(c, rng);
    run_forward(rt, c, b);
    for (const Config& config : kConfigs) {
      INFO(describe(config));
      const Grads first = run_backward(rt, b, config, true);
      check_grads(c, b, first);
      const bool same_bits = run_backward(rt, b, config, true) == first;
      CHECK(same_bits);  // not CHECK(second == first): it would print every byte
    }
  }
}

// The wgmma kernel (sm_90a) by explicit configs, block_m 64 and 128, deterministic and not, where
// its rows are least regular: varlen with empty sequences and seqused_k (a step's rows past its
// sequence, a varlen tail), bottom-right causal with more queries than keys (rows before the
// band), a bias's gradient, head dims 64 (one key warpgroup of two) and 96 (padded to 128), and
// above 128 two warpgroups that split the head dims (256; 192 and 160, padded to 256; 136 over
// 64). Deterministic runs twice, bit for bit.
TEST_CASE("attention backward by the wgmma kernel's configs, deterministic and not",
          "[gpu][attention_backward]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  if (rt.target() != "sm_90a") {
    WARN("skipped: the wgmma backward kernel runs on sm_90a only, not " << rt.target().name());
    return;
  }
  std::mt19937 rng(22);
  const Case cases[] = {
      {.heads = 4,
       .heads_kv = 2,
       .head_dim = 128,
       .score = {.causal = true},
       .seqlens_q = {300, 0, 17, 200, 129},
       .seqlens_k = {128, 64, 1, 511, 300},
       .seqused_k = {100, 0, 1, 400, 300}},
      {.dtype = DType::f16,
       .batch = 2,
       .seqlen_q = 517,
       .seqlen_k = 300,
       .heads = 4,
       .heads_kv = 1,
       .score = {.causal = true}},
      {.batch = 2,
       .seqlen_q = 200,
       .seqlen_k = 333,
       .heads = 2,
       .heads_kv = 2,
       .head_dim = 96,
       .score = {.window_left = 100},
       .bias = Bias::full},
      // 16 key blocks of 4 heads each taking turns at 32 row blocks: a misordered addition
      // shows in the bits.
      {.seqlen_q = 2048,
       .seqlen_k = 2048,
       .heads = 4,
       .heads_kv = 1,
       .head_dim = 128,
       .score = {.causal = true}},
      {.heads = 4,
       .heads_kv = 2,
       .head_dim = 256,
       .score = {.causal = true},
       .seqlens_q = {300, 0, 17, 129},
       .seqlens_k = {128, 64, 1, 300},
       .seqused_k = {100, 0, 1, 300}},
      {.dtype = DType::f16,
       .batch = 2,
       .seqlen_q = 333,
       .seqlen_k = 200,
       .heads = 2,
       .heads_kv = 1,
       .head_dim = 192,
       .head_dim_v = 160,
       .score = {.window_left = 100, .softcap = 20.0f},
       .bias = Bias::full},
      {.batch = 2,
       .seqlen_q = 200,
       .seqlen_k = 257,
       .heads = 2,
       .heads_kv = 2,
       .head_dim = 64,
       .head_dim_v = 136,
       .score = {.causal = true}},
  };
  for (const Case& c : cases) {
    INFO(describe(c));
    Backward b = prepare_backward(c, rng);
    run_forward(rt, c, b);
    for (int block_m : {64, 128}) {
      // block_m 128 needs more shared memory than sm_90a has above head dim 64; at 64, 64 rows
      // on two key warpgroups would split dQ's 64 columns, so block_m 64 takes one. Above 128
      // two warpgroups split the head dims over 64 keys and 64 rows.
      const bool wide = std::max(c.head_dim, c.dim_v()) > 128;
      if (block_m == 128 && (c.head_dim > 64 || wide)) continue;
      const bool one_warpgroup = !wide && block_m == 64 && c.head_dim <= 64;
      const Config config =
          kiln::AttentionBackwardConfig{.block_m = block_m,
                                        .block_n = one_warpgroup || wide ? 64 : 128,
                                        .warps = one_warpgroup ? 4 : 8,
                                        .kernel = kiln::AttentionBackwardKernel::wgmma};
      INFO(describe(config));
      check_grads(c, b, run_backward(rt, b, config));
      const Grads first = run_backward(rt, b, config, true);
      check_grads(c, b, first);
      const bool same_bits = run_backward(rt, b, config, true) == first;
      CHECK(same_bits);
    }
  }
}

// User variants (variant_twins.cpp) through every backward config: logit hooks declared additive
// (ALiBi's slope the row's state per head, a document mask's segment per query row), a mask
// hook (key padding, a sequence of padding only: dq 0), a sink hook (dq, dk and dv; its dsinks
// is refused), and a nonlinear logit hook through its logit_grad, alone and over softcap, a bias
// and a band.
TEST_CASE("attention backward with user variants: additive and nonlinear logit hooks, masks",
          "[gpu][attention_backward][variant]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(19);
  using kiln::test::UserVariant;
  for (DType dtype : kDTypes) {
    Case c{.dtype = dtype, .batch = 2, .seqlen_q = 113, .seqlen_k = 203, .heads = 4, .heads_kv = 2};
    for (UserVariant variant :
         {UserVariant::alibi, UserVariant::document, UserVariant::t5_bias, UserVariant::key_padding,
          UserVariant::softmax_one, UserVariant::gated_cap}) {
      c.score = {.causal = dtype == DType::f16, .variant = variant};
      run_case(rt, c, rng);
    }
    // Each query row's state under MQA at head dim 128; more queries than keys under every
    // other feature, top-left: rows past the keys' reach, and a tile's rows past the sequence.
    c.heads_kv = 1;
    c.head_dim = 128;
    c.score = {.causal = true, .variant = UserVariant::document};
    run_case(rt, c, rng);
    std::swap(c.seqlen_q, c.seqlen_k);
    c.head_dim = 96;
    c.head_dim_v = 64;
    c.score = {.causal = true,
               .window_left = 40,
               .top_left = true,
               .softcap = 5,
               .softmax_scale = 0.5f,
               .variant = UserVariant::gated_cap};
    c.bias = Bias::full;  // no dbias asked: gated_cap's logit is not additive
    run_case(rt, c, rng);
  }
}

// What the backward cannot differentiate fails to compile, and the call says why: a logit hook
// with neither logit_grad nor logit_is_additive, and dsinks through a sink hook.
TEST_CASE("attention backward refuses a logit hook without derivative, a sink hook's dsinks",
          "[gpu][attention_backward][variant]") {
  KILN_REQUIRE_GPU();
  kiln::Runtime rt(kiln::test::gpu_options());
  std::mt19937 rng(20);
  const Case c{.batch = 1, .seqlen_q = 17, .seqlen_k = 17, .score = {.sinks = true}};
  Backward b = prepare_backward(c, rng);
  run_forward(rt, c, b);
  const kiln::Variant squared{.name = "squared", .code = R"(struct kiln_variant {
  static __device__ float logit(const kiln::VariantParams&, const kiln::VariantCoords&, float x) {
    return x * x;
  }
};)"};
  const kiln::Variant sink_hook{.name = "sink_hook", .code = R"(struct kiln_variant {
  static __device__ float sink(const kiln::VariantParams&, const kiln::VariantCoords&, float s) {
    return s + 1.f;
  }
};)"};
  const auto refusal = [&](const kiln::Variant& variant) {
    b.forward.d.options.score.variant = &variant;
    try {
      run_backward(rt, b, std::nullopt);
    } catch (const kiln::Error& e) {
      CHECK(e.category() == kiln::ErrorCategory::compile);
      return std::string(e.what());
    }
    FAIL("the backward with variant " << variant.name << " ran");
    return std::string();
  };
  CHECK_THAT(refusal(squared), Catch::Contains("variant squared") &&
                                   Catch::Contains("the backward needs the derivative of "
                                                   "kiln_variant::logit") &&
                                   Catch::Contains("logit_grad"));
  CHECK_THAT(refusal(sink_hook),
             Catch::Contains("grads.dsinks through kiln_variant::sink is not supported yet"));
}
