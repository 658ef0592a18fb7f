// SPDX-License-Identifier: Apache-2.0
// Copying row tiles between global and shared memory in 16-byte pieces with plain loads and
// stores: the zero-filling tile load of the portable kernel and the coalesced store of the
// output tile. No inline assembly, so every kernel may include it.
#pragma once

#include "common/prelude.cuh"

namespace kiln::attention {

// Calls copy(row, col) for each 16-byte chunk of a Rows x Dim tile (col in elements, a multiple
// of 8), dealt to Threads threads in order: neighbouring threads take neighbouring chunks of a
// row, so each pass touches whole rows.
template <int Rows, int Dim, int Threads, class Copy>
__device__ __forceinline__ void for_each_chunk(int thread, const Copy& copy) {
  constexpr int chunks_per_row = Dim / 8;
  constexpr int chunks = Rows * chunks_per_row;
#pragma unroll
  for (int i = 0; i < (chunks + Threads - 1) / Threads; ++i) {
    const int chunk = thread + i * Threads;
    if (chunks % Threads != 0 && chunk >= chunks) break;
    copy(chunk / chunks_per_row, chunk % chunks_per_row * 8);
  }
}

// Copies a tile of Rows rows of Dim elements into smem rows of Pitch elements: global row r is
// at gmem + r * row_stride. Rows at or past valid_rows are zero-filled without being read.
template <int Rows, int Dim, int Pitch, int Threads, class T>
__device__ __forceinline__ void load_tile(T* smem, const T* gmem, long long row_stride,
                                          int valid_rows, int thread) {
  for_each_chunk<Rows, Dim, Threads>(thread, [&](int row, int col) {
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (row < valid_rows) chunk = *reinterpret_cast<const uint4*>(gmem + row * row_stride + col);
    *reinterpret_cast<uint4*>(smem + row * Pitch + col) = chunk;
  });
}

// Copies rows [0, valid_rows) of a tile of Dim-element rows from smem (rows of Pitch elements)
// to global rows at gmem + r * row_stride.
template <int Rows, int Dim, int Pitch, int Threads, class T>
__device__ __forceinline__ void store_tile(T* gmem, long long row_stride, const T* smem,
                                           int valid_rows, int thread) {
  for_each_chunk<Rows, Dim, Threads>(thread, [&](int row, int col) {
    if (row < valid_rows) {
      *reinterpret_cast<uint4*>(gmem + row * row_stride + col) =
          *reinterpret_cast<const uint4*>(smem + row * Pitch + col);
    }
  });
}

}  // namespace kiln::attention
