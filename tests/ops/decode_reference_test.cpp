// SPDX-License-Identifier: Apache-2.0
// The decode and merge references against hand-computed cases (no GPU): cache slots, the append,
// rotary positions and pairs, and merging states with empty ones.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "decode_reference.hpp"

namespace {

using kiln::DType;
using kiln::test::CacheMap;
using kiln::test::DecodeInputs;
using kiln::test::DecodeReferenceProblem;

constexpr double kInf = std::numeric_limits<double>::infinity();

Approx near(double x) {
  return Approx(x).epsilon(1e-12).margin(1e-12);
}

// One kv head of dim 4, one query head; a cache of `rows` rows of `row_len` slots holding
// v = slot number in every column and k = 0, so that a zero q averages the values it sees.
DecodeReferenceProblem small_problem(CacheMap cache, std::vector<int> seqlens) {
  DecodeReferenceProblem p;
  p.attention.head_dim = p.attention.head_dim_v = 4;
  p.cache = std::move(cache);
  p.seqlens = std::move(seqlens);
  return p;
}

DecodeInputs small_inputs(const DecodeReferenceProblem& p, int seqlen_new) {
  DecodeInputs in;
  const auto slots = static_cast<std::size_t>(p.cache.slots());
  in.q.assign(static_cast<std::size_t>(p.batch() * p.seqlen_q) * 4, 0.0);
  in.k_cache.assign(slots * 4, 0.0);
  for (std::size_t i = 0; i < slots * 4; ++i) in.v_cache.push_back(static_cast<double>(i / 4));
  if (seqlen_new > 0) {
    const auto n = static_cast<std::size_t>(p.batch() * seqlen_new) * 4;
    in.k_new.assign(n, 0.0);
    in.v_new.assign(n, 100.0);
  }
  return in;
}

}  // namespace

TEST_CASE("decode reference: slots of contiguous and paged caches", "[decode]") {
  CacheMap contiguous{.rows = 3, .row_len = 10, .batch_idx = {2, 0}};
  CHECK(contiguous.slot(0, 5) == 25);
  CHECK(contiguous.slot(1, 0) == 0);
  contiguous.batch_idx.clear();
  CHECK(contiguous.slot(1, 9) == 19);
  CHECK_THROWS(contiguous.slot(0, 10));

  // Pages of 2 slots: sequence 0 owns pages 3 then 1, sequence 1 pages 0 then 2.
  const CacheMap paged{.rows = 4, .row_len = 2, .block_table = {3, 1, 0, 2}, .max_pages = 2};
  CHECK(paged.paged());
  CHECK(paged.slot(0, 0) == 6);
  CHECK(paged.slot(0, 1) == 7);
  CHECK(paged.slot(0, 3) == 3);
  CHECK(paged.slot(1, 2) == 4);
  CHECK_THROWS(paged.slot(1, 4));
}

TEST_CASE("decode reference: the append, then attention over each sequence's keys", "[decode]") {
  // Sequence 0 holds 3 keys on pages 3, 1; sequence 1 none. One new key each, v = 100.
  DecodeReferenceProblem p =
      small_problem({.rows = 4, .row_len = 2, .block_table = {3, 1, 0, 2}, .max_pages = 2}, {3, 0});
  p.seqlen_new = 1;
  const auto r = kiln::test::decode_reference(p, small_inputs(p, 1));
  // The new keys land in slot 3 (page 1, row 1) and slot 0 (page 0, row 0); nothing else moves.
  for (std::size_t slot = 0; slot < 8; ++slot) {
    INFO("slot " << slot);
    CHECK(r.appended[slot] == (slot == 3 || slot == 0));
    CHECK(r.v_cache[slot * 4] == (r.appended[slot] ? 100.0 : static_cast<double>(slot)));
  }
  // Zero logits: sequence 0 averages slots 6, 7, 2 and the new key; sequence 1 sees only its new
  // key. The LSE is the log of the number of keys.
  CHECK(r.attention.out[0] == near((6 + 7 + 2 + 100) / 4.0));
  CHECK(r.lse[0] == near(std::log(4.0)));
  CHECK(r.attention.out[4] == near(100.0));
  CHECK(r.lse[1] == near(0.0));

  // Without the append, an empty sequence has no keys: out 0 and lse -inf.
  p.seqlen_new = 0;
  const auto none = kiln::test::decode_reference(p, small_inputs(p, 0));
  CHECK(none.attention.out[4] == 0.0);
  CHECK(none.lse[1] == -kInf);
  CHECK(none.attention.out[0] == near((6 + 7 + 2) / 3.0));
}

TEST_CASE("decode reference: rotary pairs and positions", "[decode]") {
  DecodeReferenceProblem p;
  p.attention.dtype = DType::bf16;
  p.attention.head_dim = 4;
  p.rotary_dim = 4;
  // Position 0 turns by 0, position 1 by a quarter turn in both pairs.
  p.rotary_cos = {1, 1, 0, 0};
  p.rotary_sin = {0, 0, 1, 1};
  std::vector<double> x = {1, 2, 3, 4};
  kiln::test::rotate(p, x.data(), 1);
  CHECK(x == std::vector<double>{-3, -4, 1, 2});  // pairs (0, 2) and (1, 3)
  p.rotary_interleaved = true;
  x = {1, 2, 3, 4};
  kiln::test::rotate(p, x.data(), 1);
  CHECK(x == std::vector<double>{-2, 1, -4, 3});  // pairs (0, 1) and (2, 3)
  kiln::test::rotate(p, x.data(), 0);
  CHECK(x == std::vector<double>{-2, 1, -4, 3});
  CHECK_THROWS(kiln::test::rotate(p, x.data(), 2));

  // q tokens take one position each with a band, and the first's without (FlashAttention).
  CHECK_FALSE(p.rotary_q_per_token());
  p.attention.window_right = 0;
  CHECK(p.rotary_q_per_token());
  p.attention.window_right = -1;
  p.attention.window_left = 8;
  CHECK(p.rotary_q_per_token());
}

TEST_CASE("decode reference: the appended key is rotated at its position", "[decode]") {
  DecodeReferenceProblem p = small_problem({.rows = 1, .row_len = 4}, {1});
  p.attention.dtype = DType::bf16;
  p.seqlen_new = 1;
  p.rotary_dim = 4;
  p.rotary_cos = {1, 1, 0, 0, 1, 1};  // position 1 is a quarter turn
  p.rotary_sin = {0, 0, 1, 1, 0, 0};
  DecodeInputs in = small_inputs(p, 1);
  in.k_new = {1, 2, 3, 4};
  const auto r = kiln::test::decode_reference(p, in);
  CHECK(std::vector<double>(r.k_cache.begin() + 4, r.k_cache.begin() + 8) ==
        std::vector<double>{-3, -4, 1, 2});
  CHECK(std::vector<double>(r.k_cache.begin(), r.k_cache.begin() + 4) ==
        std::vector<double>(4, 0.0));
}

TEST_CASE("merge reference: weights from the LSEs, empty states, rounding", "[decode]") {
  // Row 0: states of LSE 0 and ln 3 weigh 1/4 and 3/4, and an empty third one nothing.
  // Row 1: all empty.
  const std::vector<double> v = {4, 8, 100, 1, 2, 3};  // (tokens 2, states 3, heads 1, dim 1)
  const std::vector<double> lse = {0, std::log(3.0), -kInf, -kInf, -kInf, -kInf};
  const auto r = kiln::test::merge_reference(DType::bf16, 2, 3, 1, 1, v, lse);
  CHECK(r.out[0] == near(0.25 * 4 + 0.75 * 8));
  CHECK(r.lse[0] == near(std::log(4.0)));
  CHECK(r.out[1] == 0.0);
  CHECK(r.lse[1] == -kInf);
  CHECK(r.out_plain[0] == 7.0);

  // bf16 keeps 8 significant bits, f32 24.
  const std::vector<double> one = {1 + 0x1p-12};
  CHECK(kiln::test::merge_reference(DType::bf16, 1, 1, 1, 1, one, {0.0}).out_plain[0] == 1.0);
  CHECK(kiln::test::merge_reference(DType::f32, 1, 1, 1, 1, one, {0.0}).out_plain[0] == one[0]);
}

// The host's fp8 images, which the fp8 cache tests quantize with: OCP's E4M3FN and E5M2 values,
// round to nearest even, and every finite code back to itself.
TEST_CASE("fp8 host images: e4m3 and e5m2 values, rounding and every code", "[decode]") {
  using kiln::DType;
  using kiln::test::from_bits;
  using kiln::test::to_bits;
  CHECK(to_bits(DType::e4m3, 1.0) == 0x38);
  CHECK(to_bits(DType::e4m3, -448.0) == 0xfe);
  CHECK(to_bits(DType::e4m3, std::ldexp(1.0, -9)) == 0x01);  // the least subnormal
  CHECK(to_bits(DType::e4m3, 1.0 + 1.0 / 16) == 0x38);       // a tie: to the even code
  CHECK(to_bits(DType::e4m3, 1.0 + 3.0 / 16) == 0x3a);
  CHECK(std::isnan(from_bits(DType::e4m3, 0x7f)));
  CHECK(to_bits(DType::e5m2, 1.0) == 0x3c);  // the high byte of f16's 1.0
  CHECK(to_bits(DType::e5m2, 57344.0) == 0x7b);
  CHECK(std::isinf(from_bits(DType::e5m2, 0x7c)));
  CHECK(from_bits(DType::e5m2, 0x01) == std::ldexp(1.0, -16));
  for (DType dtype : {DType::e4m3, DType::e5m2}) {
    for (unsigned code = 0; code < 256; ++code) {
      const double value = from_bits(dtype, static_cast<std::uint16_t>(code));
      if (std::isnan(value) || std::isinf(value)) continue;
      INFO(kiln::to_string(dtype) << " code " << code);
      // -0 comes back as itself too: the sign is kept.
      CHECK(to_bits(dtype, value) == code);
    }
  }
}

// Appends into an fp8 cache: divided by the descale, rounded with saturation, attended times it.
TEST_CASE("decode reference: the append into an fp8 cache, quantized by the descales", "[decode]") {
  using kiln::test::saturate_to;
  CHECK(saturate_to(DType::e4m3, 1000.0) == 448.0);
  CHECK(saturate_to(DType::e4m3, -1e9) == -448.0);
  CHECK(saturate_to(DType::e4m3, 100.0) == 96.0);  // a tie between 96 and 104: the even code
  CHECK(saturate_to(DType::e5m2, 70000.0) == 57344.0);
  CHECK(std::isnan(saturate_to(DType::e5m2, std::numeric_limits<double>::quiet_NaN())));

  DecodeReferenceProblem p =
      small_problem({.rows = 4, .row_len = 2, .block_table = {3, 1, 0, 2}, .max_pages = 2}, {3, 0});
  p.seqlen_new = 1;
  p.cache_fp8 = DType::e4m3;
  p.v_descale = {0.125, 1.0};  // (batch, heads_kv); k_descale empty: 1
  const auto r = kiln::test::decode_reference(p, small_inputs(p, 1));
  // v_new 100: over 0.125 it is 800, saturated to 448, attended as 56; over 1, 96.
  CHECK(r.v_cache[3 * 4] == 56.0);
  CHECK(r.v_cache[0] == 96.0);
  CHECK(r.k_cache[3 * 4] == 0.0);
  CHECK(r.attention.out[0] == near((6 + 7 + 2 + 56) / 4.0));
  CHECK(r.attention.out[4] == near(96.0));
}

TEST_CASE("decode reference: the append into an fp8 cache with descales per token", "[decode]") {
  using kiln::test::row_descale;
  // A row's descale fills the range: its largest magnitude over 448 times the head's descale,
  // in fp32; 1 for a row of zeros, or one too small for fp32.
  CHECK(row_descale(DType::e4m3, 100.0, 0.125) == static_cast<float>(100.0f / (448.0f * 0.125f)));
  CHECK(row_descale(DType::e5m2, 57344.0, 1.0) == 1.0);
  CHECK(row_descale(DType::e4m3, 0.0, 1.0) == 1.0);
  CHECK(row_descale(DType::e4m3, 1e-45, 1.0) == 1.0);

  DecodeReferenceProblem p =
      small_problem({.rows = 4, .row_len = 2, .block_table = {3, 1, 0, 2}, .max_pages = 2}, {3, 0});
  p.seqlen_new = 1;
  p.cache_fp8 = DType::e4m3;
  p.v_descale = {0.125, 1.0};
  p.k_token_descale.assign(8, 2.0);  // (slots, heads_kv): inputs' cache values hold them already
  p.v_token_descale.assign(8, 2.0);
  const auto r = kiln::test::decode_reference(p, small_inputs(p, 1));
  // Sequence 0 appends into slot 3 (page 1, row 1), sequence 1 into slot 0 (page 0, row 0).
  const double d0 = row_descale(DType::e4m3, 100.0, 0.125);
  const double d1 = row_descale(DType::e4m3, 100.0, 1.0);
  CHECK(r.v_token_descale[3] == d0);
  CHECK(r.v_token_descale[0] == d1);
  CHECK(r.k_token_descale[3] == 1.0);  // k_new is 0
  CHECK(r.v_token_descale[1] == 2.0);  // slots not appended to keep theirs
  // v_new 100 is stored as 448 (not saturated: the descale took its size) and attended as 448
  // times 0.125 times d0: 100 to fp32's precision.
  const double v0 = 448.0 * static_cast<double>(0.125f * static_cast<float>(d0));
  CHECK(r.v_cache[3 * 4] == v0);
  CHECK(v0 == Approx(100.0).epsilon(1e-6));
  CHECK(r.attention.out[0] == near((6 + 7 + 2 + v0) / 4.0));
  CHECK(r.attention.out[4] == near(448.0 * d1));
}
