// A probe of the score model's device code on its own (tests/ops/core_test.cpp): one warp holds a
// 16 x (8 * s_tiles) tile of fp32 scores as the mma kernels hold theirs (core/logits.cuh), runs
// LogitTransform and the band mask over it, and writes the logits and each row's sink.
//
// The probe reads AttentionParams as a call's, sequence 0 and head heads - 1, except: q and out
// are the tile's scores and logits, fp32 (16, keys) row-major; the tile's first row is
// q_seq_stride and its first key k_seq_stride; maybe_lse gets the 16 rows' sinks, then the
// transform's to_log2 (logits times it are in log2 units).
#pragma once

#include "attention/core/logits.cuh"
#include "common/mma.cuh"

namespace probe {

template <class Spec>
__global__ void logits(const KILN_GRID_CONSTANT kiln::AttentionParams p) {
  using namespace kiln::attention;
  constexpr int s_tiles = static_cast<int>(Spec::s_tiles);
  constexpr int keys = 8 * s_tiles;
  const int lane = static_cast<int>(threadIdx.x);
  const int row_begin = static_cast<int>(p.q_seq_stride);
  const int key_begin = static_cast<int>(p.k_seq_stride);
  Sequence seq{};
  seq.batch = 0;
  seq.head = p.heads - 1;
  seq.seqlen_q = p.seqlen_q;
  seq.seqlen_k = p.seqlen_k;
  const Band band = make_band<Spec::band>(p.score, seq.seqlen_q, seq.seqlen_k);
  const int row0 = row_begin + lane / 4;
  const int key0 = key_begin + 2 * (lane % 4);
  const auto transform =
      make_logit_transform<Spec, kiln::mma::ApproxMath, 2>(p, seq, band, row0);

  // Element x of n8 tile nt: tile row lane / 4 + 8 (x / 2), tile key 2 (lane % 4) + 8 nt + x % 2.
  const auto at = [&](int nt, int x) {
    return (lane / 4 + 8 * (x / 2)) * keys + 2 * (lane % 4) + 8 * nt + x % 2;
  };
  const float* const in = static_cast<const float*>(p.q);
  float* const out = static_cast<float*>(p.out);
  float s[1][s_tiles][4];
  for (int nt = 0; nt < s_tiles; ++nt) {
    for (int x = 0; x < 4; ++x) s[0][nt][x] = in[at(nt, x)];
  }
  transform.apply(s, key0, true, [&] { mask_logits(s, band, row0, key0); });
  for (int nt = 0; nt < s_tiles; ++nt) {
    for (int x = 0; x < 4; ++x) out[at(nt, x)] = s[0][nt][x];
  }
  float sink[2];
  transform.sinks(sink, p.score);
  if (lane % 4 == 0) {
    p.maybe_lse[lane / 4] = sink[0];
    p.maybe_lse[lane / 4 + 8] = sink[1];
  }
  if (lane == 0) p.maybe_lse[16] = transform.to_log2();
}

}  // namespace probe
