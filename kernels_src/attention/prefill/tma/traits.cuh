// SPDX-License-Identifier: Apache-2.0
// The tma kernel's shapes (the wgmma kernel's, plus its warpgroups' roles and registers) and the
// barriers its warpgroups meet at.
#pragma once

#include "attention/prefill/forward_wgmma.cuh"
#include "common/pipeline.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct TmaTraits : WgmmaTraits<Spec> {
  using Base = WgmmaTraits<Spec>;
  static constexpr int consumer_groups = Base::block_m / 64;
  static constexpr int consumer_threads = consumer_groups * 128;
  static constexpr int consumer_warps = consumer_threads / 32;
  static constexpr int threads = consumer_threads + 128;  // and the producer warpgroup
  // setmaxnreg counts: the producer keeps 40 beside two consumer warpgroups (walking the tiles
  // under a band it needs them; with 24 it spilled 68-92 bytes, while the consumers do not spill
  // at the 232 left to them) and 32 beside three, exactly what is left once each of them has 160
  // (whose 160 are tight; 24, the least there is, gave them no more, since counts go by 8, and
  // left the producer spilling at the slightest change to its code).
  // The consumers take what the CTA was launched with beyond that, at most 240 (multiples of 8).
  // A count the launch did not provide makes setmaxnreg.inc wait forever.
  static constexpr int launch_registers = 65536 / threads / 8 * 8;  // per thread, as ptxas gives
  static constexpr int producer_registers = consumer_groups == 2 ? 40 : 32;
  static constexpr int spare_registers =
      (launch_registers * threads - producer_registers * 128) / consumer_threads / 8 * 8;
  static constexpr int consumer_registers = spare_registers < 240 ? spare_registers : 240;
  static_assert(producer_registers * 128 + consumer_registers * consumer_threads <=
                    launch_registers * threads,
                "the warpgroups' registers do not fit what the CTA is launched with.");
  static_assert(consumer_groups != 3 || consumer_registers == 160,
                "three consumer warpgroups must keep 160 registers each beside the producer.");
  // Whether an output staging tile follows the Q and K/V tiles (attention_forward_tma_staged).
  static constexpr bool staged =
      attention_forward_tma_staged(Base::head_dim, Base::head_dim_v, Base::block_m, Base::block_n,
                                   Base::stages, Base::q_size, Base::kv_size, Base::out_size);
  static constexpr int staging_offset = Base::q_bytes + Base::stages * Base::slot_bytes;
};

// What the producer and the consumers meet at, in static shared memory. Q's slot is one stage
// that carries its tile's index: the consumers learn their next tile from it, and hand the slot
// back once the tile's last scores are in, so the next tile's Q loads under the tile's last
// product and its output stores. K and V of a slot have barriers of their own: a warpgroup is
// done with K once its scores are in, well before it is done with V, and the next K load need
// not wait for V.
template <class Tr>
struct TmaBarriers {
  int q_tile_index;  // written by the producer before it fills Q's slot (-1: none left)
  tma::Pipeline<1> q;
  tma::Pipeline<Tr::stages> k;
  tma::Pipeline<Tr::stages> v;
  // A V block that holds its sequence's last key lands here instead of v.full: the producer
  // zeroes its rows past that key, then arrives on v.full itself.
  tma::BarrierRing<1> v_tail;

  // One thread, before a CTA barrier. The producer's single arrival (with the loads' bytes)
  // fills a slot; Q's slot empties once every consumer thread read its tile index, a K or V
  // slot once every consumer warp is done with it.
  __device__ __forceinline__ void init() {
    q.init(1, Tr::consumer_threads);
    v_tail.init(1);
    k.init(1, Tr::consumer_warps);
    v.init(1, Tr::consumer_warps);
    tma::fence_init();
  }
};

}  // namespace attention
}  // namespace kiln
