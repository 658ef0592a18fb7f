// SPDX-License-Identifier: Apache-2.0
// Probes of the score model's device code on its own (tests/ops/core_test.cpp): one warp holds a
// tile of fp32 scores as a kernel holds its own (core/logits.cuh), runs LogitTransform and the
// band mask over it, and writes the logits and each row's sink. Three shapes, as the kernels use
// the transform:
//   logits         prefill's fragments: 16 rows, row r of a thread its row0 + 8 r (RowStep 8);
//   packed_logits  decode's packed rows (attention/decode/packing.cuh): 16 * m_tiles rows of
//                  queries and heads of the last kv head, each row with its own coordinates
//                  (RowStep 0), the rows past the last packed one standing in as it;
//   row_logits     the portable kernel's whole rows: 32 rows, one per thread (float[Keys]).
//
// The probes read AttentionParams as a call's, sequence 0, except: q and out are the tile's
// scores and logits, fp32 (rows, 8 * s_tiles) row-major; the tile's first row (packed_logits: its
// first packed row) is q_seq_stride and its first key kv.k_seq_stride; maybe_lse gets the rows'
// sinks, then the transform's to_log2 (logits times it are in log2 units). logits and
// row_logits take head heads - 1.
#pragma once

#include "attention/core/logits.cuh"
#include "attention/decode/packing.cuh"
#include "attention/prefill/logits.cuh"
#include "common/mma.cuh"

namespace probe {

using namespace kiln::attention;

// Sequence 0, head heads - 1, as a prefill kernel locates it.
__device__ __forceinline__ Sequence last_head(const kiln::AttentionParams& p) {
  Sequence seq{};
  seq.batch = 0;
  seq.head = p.heads - 1;
  seq.head_kv = seq.head / (p.heads / p.heads_kv);
  seq.seqlen_q = p.seqlen_q;
  seq.seqlen_k = p.seqlen_k;
  return seq;
}

// Where a lane's element x of n8 tile nt in m16 tile mt sits in the (rows, keys) tile: row
// 16 mt + lane / 4 + 8 (x / 2), key 2 (lane % 4) + 8 nt + x % 2.
template <int MTiles, int STiles>
struct Fragments {
  static constexpr int keys = 8 * STiles;
  float s[MTiles][STiles][4];

  __device__ __forceinline__ static int at(int lane, int mt, int nt, int x) {
    return (16 * mt + lane / 4 + 8 * (x / 2)) * keys + 2 * (lane % 4) + 8 * nt + x % 2;
  }
  __device__ __forceinline__ void load(const void* in, int lane) {
    for (int mt = 0; mt < MTiles; ++mt) {
      for (int nt = 0; nt < STiles; ++nt) {
        for (int x = 0; x < 4; ++x)
          s[mt][nt][x] = static_cast<const float*>(in)[at(lane, mt, nt, x)];
      }
    }
  }
  __device__ __forceinline__ void store(void* out, int lane) const {
    for (int mt = 0; mt < MTiles; ++mt) {
      for (int nt = 0; nt < STiles; ++nt) {
        for (int x = 0; x < 4; ++x) static_cast<float*>(out)[at(lane, mt, nt, x)] = s[mt][nt][x];
      }
    }
  }
};

// Each fragment row's sink to maybe_lse (row 8 r + lane / 4), then to_log2 after the tile's rows.
template <int Rows>
__device__ __forceinline__ void store_sinks(const kiln::AttentionParams& p,
                                            const float (&sink)[Rows], float to_log2, int lane) {
  if (lane % 4 == 0) {
    for (int r = 0; r < Rows; ++r) p.maybe_lse[8 * r + lane / 4] = sink[r];
  }
  if (lane == 0) p.maybe_lse[8 * Rows] = to_log2;
}

template <class Spec>
__global__ void logits(const KILN_GRID_CONSTANT kiln::AttentionParams p) {
  const int lane = static_cast<int>(threadIdx.x);
  const Sequence seq = last_head(p);
  const Band band = make_band<Spec::band>(p.score, seq.seqlen_q, seq.seqlen_k);
  const int row0 = static_cast<int>(p.q_seq_stride) + lane / 4;
  const int key0 = static_cast<int>(p.kv.k_seq_stride) + 2 * (lane % 4);
  const auto transform = make_logit_transform<Spec, kiln::mma::ApproxMath, 2>(p, seq, band, row0);

  Fragments<1, static_cast<int>(Spec::s_tiles)> tile;
  tile.load(p.q, lane);
  transform.apply(tile.s, key0, true, [&] { mask_logits(tile.s, band, row0, key0); });
  tile.store(p.out, lane);
  float sink[2];
  transform.sinks(sink, p.score);
  store_sinks(p, sink, transform.to_log2(), lane);
}

template <class Spec>
__global__ void packed_logits(const KILN_GRID_CONSTANT kiln::AttentionParams p) {
  constexpr int m_tiles = static_cast<int>(Spec::m_tiles);
  constexpr int rows = 2 * m_tiles;
  const int lane = static_cast<int>(threadIdx.x);
  const int group = p.heads / p.heads_kv;
  const kiln::decode::PackedRows packed{p.heads_kv - 1, group, p.seqlen_q * group};
  const Band band = make_band<Spec::band>(p.score, p.seqlen_q, p.seqlen_k);
  const int key0 = static_cast<int>(p.kv.k_seq_stride) + 2 * (lane % 4);
  auto transform =
      make_score_transform<Spec, kiln::mma::ApproxMath, rows, 0>(p.score, p.seqlen_q, p.seqlen_k);
  int first_key[rows];
  int last_key[rows];
  float sink[rows];
  for (int r = 0; r < rows; ++r) {
    const auto [query, head] =
        packed.at_or_last(static_cast<int>(p.q_seq_stride) + 8 * r + lane / 4);
    transform.rows[r] =
        make_logit_row<Spec>(p.score, {0, head, packed.kv_head, query, -1, band.offset});
    first_key[r] = band.first_key(query);
    last_key[r] = band.last_key(query);
    sink[r] = row_sink<Spec>(p.score, transform.rows[r]);
  }

  Fragments<m_tiles, static_cast<int>(Spec::s_tiles)> tile;
  tile.load(p.q, lane);
  transform.apply(tile.s, key0, true, [&] { mask_keys(tile.s, first_key, last_key, key0); });
  tile.store(p.out, lane);
  store_sinks(p, sink, transform.to_log2(), lane);
}

template <class Spec>
__global__ void row_logits(const KILN_GRID_CONSTANT kiln::AttentionParams p) {
  constexpr int keys = 8 * static_cast<int>(Spec::s_tiles);
  const int lane = static_cast<int>(threadIdx.x);
  const Sequence seq = last_head(p);
  const Band band = make_band<Spec::band>(p.score, seq.seqlen_q, seq.seqlen_k);
  const int row = static_cast<int>(p.q_seq_stride) + lane;
  const int key0 = static_cast<int>(p.kv.k_seq_stride);
  const auto transform = make_logit_transform<Spec, LibraryMath, 1>(p, seq, band, row);

  float s[keys];
  for (int j = 0; j < keys; ++j) s[j] = static_cast<const float*>(p.q)[lane * keys + j];
  transform.apply(s, key0, true, [&] { mask_row(s, band, row, key0); });
  for (int j = 0; j < keys; ++j) static_cast<float*>(p.out)[lane * keys + j] = s[j];
  float sink[1];
  transform.sinks(sink, p.score);
  p.maybe_lse[lane] = sink[0];
  if (lane == 0) p.maybe_lse[32] = transform.to_log2();
}

}  // namespace probe
