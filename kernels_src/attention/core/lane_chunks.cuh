// SPDX-License-Identifier: Apache-2.0
// Rows split between neighbouring lanes in 8-element (16-byte) chunks, as the portable kernels
// (prefill forward and backward) hold them in fp32: which chunks a lane holds, 16-byte loads and
// stores that convert, and sums over a row's group of lanes. No inline assembly.
#pragma once

#include "common/prelude.cuh"

namespace kiln::attention {

// The chunks a lane holds of a row of `chunks` chunks split between `lanes` lanes.
__host__ __device__ constexpr int lane_chunks(int chunks, int lanes) {
  return (chunks + lanes - 1) / lanes;
}

// Calls f(i, col) for each chunk this lane of a row's group holds in a row of Chunks chunks: i
// counts the lane's chunks, col is the chunk's first element in the row. The last round may
// leave some lanes of the group without one.
template <int Chunks, int RowLanes, class F>
__device__ __forceinline__ void for_lane_chunks(int lane, const F& f) {
#pragma unroll
  for (int i = 0; i < lane_chunks(Chunks, RowLanes); ++i) {
    if (Chunks % RowLanes != 0 && i * RowLanes + lane >= Chunks) break;
    f(i, (i * RowLanes + lane) * 8);
  }
}

// 8 elements in one 16-byte access (at must be 16-byte aligned).
template <class T>
struct alignas(16) Chunk {
  T x[8];
};

template <class T>
__device__ __forceinline__ void load_chunk(float (&x)[8], const T* at) {
  const Chunk<T> c = *reinterpret_cast<const Chunk<T>*>(at);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] = to_float(c.x[e]);
}

template <class T>
__device__ __forceinline__ void store_chunk(T* at, const float (&x)[8]) {
  Chunk<T> c;
#pragma unroll
  for (int e = 0; e < 8; ++e) c.x[e] = from_float<T>(x[e]);
  *reinterpret_cast<Chunk<T>*>(at) = c;
}

template <int Chunks>
__device__ __forceinline__ void fill(float (&x)[Chunks][8], float value) {
#pragma unroll
  for (int i = 0; i < Chunks; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) x[i][e] = value;
  }
}

// The sum of x over the group of Lanes neighbouring lanes (an aligned power of two), in each.
template <int Lanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int mask = Lanes / 2; mask > 0; mask /= 2) x += shfl_xor(x, mask);
  return x;
}

// s[j] = x . row j of a tile of Keys rows of Dim elements, for every row, in every lane of the
// row's group of Lanes lanes; x holds this lane's chunks (for_lane_chunks) of a Dim-element row.
template <int Keys, int Dim, int Lanes, class T>
__device__ __forceinline__ void tile_dots(float (&s)[Keys],
                                          const float (&x)[lane_chunks(Dim / 8, Lanes)][8],
                                          const T* tile, int lane) {
#pragma unroll
  for (int j = 0; j < Keys; ++j) {
    float dot = 0.f;
    for_lane_chunks<Dim / 8, Lanes>(lane, [&](int i, int col) {
      float t[8];
      load_chunk(t, tile + j * Dim + col);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(x[i][e], t[e], dot);
    });
    s[j] = group_sum<Lanes>(dot);
  }
}

// o += sum over j of weights[j] * row j of a tile of Keys rows of Dim elements, for this lane's
// chunks of o.
template <int Keys, int Dim, int Lanes, class T>
__device__ __forceinline__ void tile_accumulate(float (&o)[lane_chunks(Dim / 8, Lanes)][8],
                                                const float (&weights)[Keys], const T* tile,
                                                int lane) {
#pragma unroll
  for (int j = 0; j < Keys; ++j) {
    for_lane_chunks<Dim / 8, Lanes>(lane, [&](int i, int col) {
      float t[8];
      load_chunk(t, tile + j * Dim + col);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[i][e] = fmaf(weights[j], t[e], o[i][e]);
    });
  }
}

}  // namespace kiln::attention
