// SPDX-License-Identifier: Apache-2.0
// Moving row tiles from global to shared memory in 16-byte cp.async pieces that zero-fill past
// the tensor's edges; the plain copies (the output store among them) are in tile_copy.cuh.
#pragma once

#include "attention/core/tile_copy.cuh"
#include "attention/core/traits.cuh"
#include "common/mma.cuh"

namespace kiln::attention {

// Starts copying a Rows x PaddedDim tile to shared memory, row r's 16-byte piece at column col
// (a multiple of its 16 / sizeof(T) elements) to shared address `to(row, r, col)`, row the
// thread's first row: global row r is at gmem + r * row_stride and has Dim elements. Rows at or
// past valid_rows and pieces from Dim on (Dim a multiple of the piece's elements) are
// zero-filled without being read. Policy: how long the L2 keeps the tile (mma::L2). Commits
// nothing.
//
// Each thread keeps one 16-byte column and walks down the rows, a pass of
// Threads / chunks_per_row rows at a time (the threads left over when the row's chunk count
// does not divide Threads sit out).
template <int Rows, int Dim, int PaddedDim, int Threads, mma::L2 Policy = mma::L2::keep, class T,
          class To>
__device__ __forceinline__ void copy_tile_async(const T* gmem, long long row_stride, int valid_rows,
                                                int thread, const To& to) {
  constexpr int chunk = 16 / static_cast<int>(sizeof(T));  // elements
  static_assert(Dim % chunk == 0 && PaddedDim % chunk == 0,
                "a tile row must be whole 16-byte pieces.");
  constexpr int chunks_per_row = PaddedDim / chunk;
  constexpr int rows_per_pass = Threads / chunks_per_row;
  constexpr int passes = (Rows + rows_per_pass - 1) / rows_per_pass;
  static_assert(rows_per_pass >= 1, "a tile row has more 16-byte chunks than the CTA has threads.");
  const int row = thread / chunks_per_row;
  const int col = thread % chunks_per_row * chunk;
  if (Threads % chunks_per_row != 0 && row >= rows_per_pass) return;
  const bool col_valid = col < Dim;
  const T* src = gmem + row * row_stride + col;
  const long long pass_stride = rows_per_pass * row_stride;
#pragma unroll
  for (int i = 0; i < passes; ++i) {
    const int r = row + i * rows_per_pass;
    if (Rows % rows_per_pass != 0 && r >= Rows) break;
    const bool valid = col_valid && r < valid_rows;
    mma::cp_async_16<Policy>(to(row, r, col), valid ? src : gmem, valid);
    // NOTE: stepping one pointer (hidden from the optimizer) rather than computing each pass's
    // address keeps the compiler from hoisting a 64-bit offset per pass out of the KV loop,
    // which cost ~80 registers and spills.
    src = mma::opaque(src + pass_stride);
  }
}

// copy_tile_async into smem rows of Pitch elements, laid out as tile_offset<Pitch, Swizzle>
// (traits.cuh).
template <int Rows, int Dim, int PaddedDim, int Pitch, int Threads, int Swizzle = 1,
          mma::L2 Policy = mma::L2::keep, class T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, long long row_stride,
                                                int valid_rows, int thread) {
  constexpr int size = static_cast<int>(sizeof(T));
  // NOTE: from the thread's first row, as the compiler then adds a constant per pass.
  copy_tile_async<Rows, Dim, PaddedDim, Threads, Policy>(
      gmem, row_stride, valid_rows, thread, [&](int row, int r, int col) {
        return mma::smem_address(smem + row * Pitch) + (r - row) * Pitch * size +
               size * tile_offset<0, Swizzle, 16 / size>(r, col);
      });
}

}  // namespace kiln::attention
