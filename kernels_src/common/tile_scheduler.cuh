// SPDX-License-Identifier: Apache-2.0
// Hands the tiles of a persistent grid (a CTA per SM, or fewer) to its CTAs, by index; what an
// index means is the kernel's (attention/prefill/tma/tile_order.cuh for the tma kernel).
#pragma once

#include "common/prelude.cuh"

namespace kiln {

// Each CTA starts with the tile of its own index, then takes the next one nobody has from a
// counter in global memory, so that a CTA that drew light tiles takes more. The counter
// ({next, finished CTAs}) starts zero and is left zero: the last CTA to finish resets it, which
// no other CTA of the launch can still touch, and the stream orders launches. Without one (null:
// the host had none for this stream) each CTA takes every gridDim.x-th tile.
struct TileScheduler {
  unsigned* counter;

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }
  // The tile after `current`; the whole warp calls it and gets the same answer.
  __device__ __forceinline__ int next(int current) const {
    if (counter == nullptr) return current + static_cast<int>(gridDim.x);
    unsigned taken = 0;
    if (threadIdx.x % 32 == 0) taken = gridDim.x + atomicAdd(&counter[0], 1u);
    return static_cast<int>(__shfl_sync(0xffffffffu, taken, 0));
  }
  // One thread of each CTA, after the CTA's last next().
  __device__ __forceinline__ void finish() const {
    if (counter == nullptr) return;
    __threadfence();  // this CTA's takes are seen before its finish
    if (atomicAdd(&counter[1], 1u) == gridDim.x - 1) {
      atomicExch(&counter[0], 0u);
      atomicExch(&counter[1], 0u);
    }
  }
};

}  // namespace kiln
