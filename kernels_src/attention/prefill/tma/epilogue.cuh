// SPDX-License-Identifier: Apache-2.0
// The end of a tma kernel tile: each row's softmax finished with its sink, then the output rows
// and the LSE to global memory. Where shared memory has room for a staging tile
// (TmaTraits::staged) the output leaves by bulk copies under the next tile's products;
// otherwise each thread stores its accumulators.
#pragma once

#include "attention/prefill/tma/traits.cuh"

namespace kiln {
namespace attention {

// Stores a thread's output rows (row0 and row0 + 8, those before row_end) from its accumulators
// where there is no room to stage them: a quad writes 16 bytes of a row per n8 tile, which L2
// gathers into whole sectors.
template <class Tr>
__device__ __forceinline__ void store_output(typename Tr::Out* out, long long row_stride,
                                             const float (&o)[1][Tr::o_tiles][4], int row0,
                                             int row_end, int lane) {
  using T = typename Tr::Out;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= row_end) continue;
    T* const columns = out + row * row_stride + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Tr::o_tiles; ++j) {
      if (j * 8 < Tr::head_dim_v) {  // the tiles past head_dim_v hold padding
        *reinterpret_cast<unsigned*>(columns + j * 8) =
            mma::pack2<T>(o[0][j][2 * half], o[0][j][2 * half + 1]);
      }
    }
  }
}

template <class Spec>
struct TmaEpilogue {
  using Tr = TmaTraits<Spec>;
  using Out = typename Tr::Out;

  const AttentionParams& p;
  unsigned char* tiles;  // Q's slot, the K/V slots, fp8 staging entries, (Tr::staged) the output's
  int warp;
  int lane;

  // Rows from row0 (and row0 + 8) of `tile`, out of the consumers' key loop's o and softmax.
  template <class Transform, class Softmax>
  __device__ __forceinline__ void store(float (&o)[1][Tr::o_tiles][4], Softmax& softmax,
                                        const Tile& tile, const Transform& transform, float to_log2,
                                        int row0) const {
    const Sequence& seq = tile.seq;
    const RowBlock& rows = tile.rows;
    float lse[2];
    float sink[2];
    transform.sinks(sink, p.score);
    softmax.template finish<Tr::kv_fp8>(o, to_log2, lse, sink, output_scale<Tr>(p, seq));
    Out* const out = static_cast<Out*>(p.out) + seq.out_offset;
    if constexpr (Tr::staged) {
      // Each warp stages its 16 rows and copies them out with bulk copies, a row each, which run
      // while the warp goes on to the next tile; the rows are free again once the copies have
      // read them.
      Out* const staging = reinterpret_cast<Out*>(tiles + Tr::staging_offset);
      tma::wait_bulk_read<0>();
      __syncwarp();
      stage_output<Tr>(staging, o, warp, lane);
      wgmma::fence_shared_for_async();
      __syncwarp();
      const int staged_row = warp * Tr::rows_per_warp + lane;
      const int row = rows.begin + staged_row;
      if (lane < Tr::rows_per_warp && row < rows.end) {
        tma::store_bulk(out + row * p.out_seq_stride,
                        mma::smem_address(staging + staged_row * Tr::v_pitch),
                        Tr::head_dim_v * Tr::out_size);
      }
      tma::commit_bulk();
    } else {
      store_output<Tr>(out, p.out_seq_stride, o, row0, rows.end, lane);
    }
    if (p.maybe_lse != nullptr)
      store_lse<Tr>(p.maybe_lse + seq.lse_offset, lse, row0, seq.seqlen_q, lane);
  }

  // After the last tile: the copies are done before the CTA exits.
  __device__ __forceinline__ static void finish() {
    if constexpr (Tr::staged) tma::wait_bulk<0>();
  }
};

}  // namespace attention
}  // namespace kiln
