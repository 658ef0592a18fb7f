// SPDX-License-Identifier: Apache-2.0
// Forward attention on Hopper (sm_90a), warp-specialized: a producer warp streams Q, K and V
// tiles with TMA (cp.async.bulk.tensor) into the 128-byte-swizzled layout wgmma reads, signalling
// shared-memory mbarriers; block_m / 64 consumer warpgroups compute as forward_wgmma.cuh does,
// each on 64 query rows, and hand each K/V slot back through an mbarrier when done with it. No
// CTA-wide barrier in the key loop. The grid is persistent, a CTA per SM taking tile after tile
// (common/tile_scheduler.cuh, in the order of tma/tile_order.cuh), so that a tile's loads run
// under the last one's products. Where shared memory has room for an output staging tile
// (attention_forward_tma_staged: head dims up to 128) a tile's output leaves by bulk copies under
// the next one's products; otherwise each thread stores its accumulators. The producer
// warpgroup hands registers back (setmaxnreg) to the consumers.
//
// Its parts, in attention/prefill/tma/: traits.cuh (shapes, registers, the barriers, on
// common/pipeline.cuh), producer.cuh (the loads), mainloop.cuh (the consumers' key loop),
// epilogue.cuh (output and LSE stores) and tile_order.cuh.
//
// Spec constants: those of attention_forward_wgmma (block_m, block_n, stages). With two consumer
// warpgroups (block_m 128) they take turns at the tensor cores (ping-pong, tma/mainloop.cuh);
// with three (192) the scheduler interleaves them.
//
// Keys past a sequence's end get probability 0, and their V rows are zeros whatever memory holds
// there: TMA reads zeros past the tensor's token dim, and the producer zeroes the rest of the
// block that holds a sequence's last key (a varlen neighbour's rows, or rows past seqused_k).
//
// Launch: grid (x) at most one CTA per SM, and at most the tile count, ceil(seqlen_q / block_m) *
// heads * batch; block (block_m / 64 + 1) * 128 threads; dynamic shared memory
// attention_forward_tma_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages); the
// argument is an AttentionTmaParams whose tensor maps have boxes of 64 columns by block_m (q)
// and block_n (k, v) rows.
#pragma once

#include "attention/prefill/tma/epilogue.cuh"
#include "attention/prefill/tma/mainloop.cuh"
#include "attention/prefill/tma/producer.cuh"

namespace kiln {

// The kernel, as its roles: the barriers set up, then the producer warp's loads
// (tma/producer.cuh), or each consumer warpgroup's tiles, every one through the mainloop
// (tma/mainloop.cuh) and the epilogue (tma/epilogue.cuh).
template <class Spec>
__global__ void __launch_bounds__(attention::TmaTraits<Spec>::threads, 1)
    attention_forward_tma(const KILN_GRID_CONSTANT AttentionTmaParams tp) {
  using namespace attention;
  using Tr = TmaTraits<Spec>;
  using T = typename Tr::T;
  const AttentionParams& p = tp.p;

  extern __shared__ __align__(1024) unsigned char tma_smem[];
  __shared__ TmaBarriers<Tr> bars;
  unsigned char* const tiles = tma_smem + (1024 - mma::smem_address(tma_smem) % 1024) % 1024;

  const int thread = threadIdx.x;
  if (thread == 0) bars.init();
  __syncthreads();
  const TileOrder<Spec, Tr::block_m, Tr::block_n> order{p, tp.section_pairs};

  if (thread >= Tr::consumer_threads) {
    // The producer: the first warp of the last warpgroup.
    tma::release_registers<Tr::producer_registers>();
    if (thread >= Tr::consumer_threads + 32) return;
    TmaProducer<Spec>(tp, bars, tiles, thread % 32).run(order);
    return;
  }

  tma::claim_registers<Tr::consumer_registers>();
  const int warp = thread / 32;
  const int lane = thread % 32;
  TmaConsumer<Spec> consumer(bars, mma::smem_address(tiles), warp, lane);
  const TmaEpilogue<Spec> epilogue{p, tiles, warp, lane};
  consumer.start();
  for (;;) {
    const int index = consumer.take_tile();
    if (index < 0) break;
    const Tile tile = order.tile(index);
    const int row0 = tile.rows.begin + warp * Tr::rows_per_warp + lane / 4;
    const auto transform =
        make_logit_transform<Spec, mma::ApproxMath, 2>(p, tile.seq, tile.band, row0);
    const float to_log2 = transform.to_log2();
    float o[1][Tr::o_tiles][4];
    zero_fragments(o);
    typename TmaConsumer<Spec>::Softmax softmax;
    softmax.init();
    consumer.mainloop(o, softmax, tile, transform, to_log2, row0);
    epilogue.store(o, softmax, tile, transform, to_log2, row0);
  }
  consumer.finish();
  epilogue.finish();
}

}  // namespace kiln
