// SPDX-License-Identifier: Apache-2.0
// The order in which the tma kernel's persistent CTAs take the grid's tiles (TileScheduler hands
// out the indices).
#pragma once

#include "attention/prefill/sequence.cuh"

namespace kiln {
namespace attention {

// The (batch, head) pairs fall into sections of section_pairs neighbours, whose K and V the host
// sized to stay in L2 together; a section's tiles come before the next section's, and within one
// the last row block of every pair comes first (under a causal band it has the most keys), then
// the one before it, so the heaviest tiles start first and the lightest fill the tail.
template <class Spec, int BlockM, int BlockN>
struct TileOrder {
  const AttentionParams& p;
  int section_pairs;

  __device__ __forceinline__ int row_blocks() const { return (p.seqlen_q + BlockM - 1) / BlockM; }
  __device__ __forceinline__ int count() const { return row_blocks() * p.heads * p.batch; }

  __device__ __forceinline__ Tile tile(int index) const {
    const int per_section = row_blocks() * section_pairs;
    const int first_pair = index / per_section * section_pairs;
    const int pairs = min(section_pairs, p.heads * p.batch - first_pair);
    const int within = index - first_pair * row_blocks();
    const int pair = first_pair + within % pairs;
    return make_tile<Spec, BlockM, BlockN>(p, pair / p.heads, pair % p.heads,
                                           row_blocks() - 1 - within / pairs);
  }
};

}  // namespace attention
}  // namespace kiln
