// SPDX-License-Identifier: Apache-2.0
// The tma kernel's consumer warpgroups: each takes the tile the producer handed over with Q's
// slot and runs its 64 rows through the key blocks, S = Q K^T, logits and the online softmax,
// O += P V, as forward_wgmma.cuh does, handing each K and V slot back as soon as it is done.
#pragma once

#include "attention/prefill/tma/traits.cuh"

namespace kiln {
namespace attention {

// Ping-pong: with two consumer warpgroups, each issues its products only in its turn and then
// passes the turn on, so that one's softmax runs while the other's products keep the tensor cores
// busy. Named barrier 2 + g is warpgroup g's turn: its 128 threads sync on it, the other's 128
// arrive. Both take a turn per key block of the tile they share, so the turns run on from tile to
// tile, and one warpgroup's first products of a tile go in while the other still finishes the
// last: the second warpgroup hands the first its first turn before any tile (start), and the
// first takes the second's last hand-off after the last (finish). With three warpgroups the
// scheduler interleaves them and turns are no-ops.
template <int ConsumerGroups>
struct TensorCoreTurns {
  static constexpr bool ping_pong = ConsumerGroups == 2;
  int warpgroup;

  __device__ __forceinline__ void start() const {
    if (ping_pong && warpgroup == 1) tma::named_arrive(2, 256);
  }
  __device__ __forceinline__ void take() const {
    if constexpr (ping_pong) tma::named_sync(2 + warpgroup, 256);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (ping_pong) tma::named_arrive(3 - warpgroup, 256);
  }
  __device__ __forceinline__ void finish() const {
    if (ping_pong && warpgroup == 0) take();
  }
};

template <class Spec>
struct TmaConsumer {
  using Tr = TmaTraits<Spec>;
  // Where o is large enough for the rescale vote, a running max that lags the rows' logits by up
  // to 2^8 leaves most steps no rescale. Measured on an H100: 6% faster at head dim 256; at 64,
  // voting on every step as well, 7-9% slower.
  using Softmax = OnlineSoftmax<1, 128, OnlineSoftmax<1>::votes<Tr::o_tiles> ? 8 : 0>;

  TmaBarriers<Tr>& bars;
  unsigned q_rows;  // this warpgroup's 64 rows of Q; 8-row groups are 1024 bytes apart per chunk
  unsigned kv_base;
  int lane;
  TensorCoreTurns<Tr::consumer_groups> turns;
  tma::PipelineState<1> q_at{};
  tma::PipelineState<Tr::stages> kv_at{};  // the next tile's first key block: its K and its V

  __device__ __forceinline__ TmaConsumer(TmaBarriers<Tr>& bars_, unsigned q_tile, int warp,
                                         int lane_)
      : bars(bars_),
        q_rows(q_tile + warp / 4 * 64 * 128),
        kv_base(q_tile + Tr::q_bytes),
        lane(lane_),
        turns{warp / 4} {}

  // Before the first tile.
  __device__ __forceinline__ void start() const { turns.start(); }

  // The index of the next tile, which Q's slot holds once it is full; -1: none left.
  __device__ __forceinline__ int take_tile() {
    bars.q.full.wait(q_at);
    return *static_cast<volatile int*>(&bars.q_tile_index);
  }

  // Rows from row0 (and row0 + 8) of `tile` through its key blocks into o and softmax. Block j's
  // scores are computed while block j - 1's probabilities multiply V, and its softmax runs under
  // that product; o is rescaled once the product is in. Q's slot goes back once the last scores
  // are in.
  template <class Transform>
  __device__ __forceinline__ void mainloop(float (&o)[1][Tr::o_tiles][4], Softmax& softmax,
                                           const Tile& tile, const Transform& transform,
                                           float to_log2, int row0) {
    const KeyBlocks& blocks = tile.blocks;
    const int count = blocks.end - blocks.begin;
    // No key block (count is never negative): Q's slot goes back at once.
    if (count == 0) release_q();
    if (count <= 0) return;
    const auto transform_logits = [&](float(&s)[1][Tr::s_tiles][4], int block) {
      pin_columns(s);
      const int key0 = block * Tr::block_n + 2 * (lane % 4);
      transform.apply(s, key0, blocks.needs_mask(block, Tr::block_n),
                      [&] { mask_logits(s, tile.band, row0, key0); });
    };

    // Block begin + j's K and V take the ring position j past kv_at.
    float s[1][Tr::s_tiles][4];
    unsigned a[Tr::block_n / 16][4];
    bars.k.full.wait(kv_at);
    turns.take();
    start_scores<Tr>(s, q_rows, k_tile(kv_at));
    turns.pass();
    wgmma::wait<0>();
    release(bars.k, kv_at);
    if (count == 1) release_q();
    transform_logits(s, blocks.begin);
    softmax.update(s, o, to_log2);
    probability_fragments<Tr>(a, s);
    for (int j = 1; j < count; ++j) {
      const tma::PipelineState<Tr::stages> k_at = kv_at.after(j);
      const tma::PipelineState<Tr::stages> v_at = kv_at.after(j - 1);
      bars.k.full.wait(k_at);
      bars.v.full.wait(v_at);
      turns.take();
      start_scores<Tr>(s, q_rows, k_tile(k_at));
      start_output<Tr>(o, a, v_tile(v_at));
      turns.pass();
      wgmma::wait<1>();
      release(bars.k, k_at);
      if (j + 1 == count) release_q();
      transform_logits(s, blocks.begin + j);
      float rescale[2];
      softmax.exponentiate(s, to_log2, rescale);
      output_done(o, v_at);
      softmax.rescale_output(o, rescale);
      probability_fragments<Tr>(a, s);
    }
    const tma::PipelineState<Tr::stages> last = kv_at.after(count - 1);
    bars.v.full.wait(last);
    start_output<Tr>(o, a, v_tile(last));
    output_done(o, last);
    kv_at = kv_at.after(count);
  }

  // After the last tile.
  __device__ __forceinline__ void finish() const { turns.finish(); }

 private:
  __device__ __forceinline__ unsigned k_tile(tma::PipelineState<Tr::stages> at) const {
    return kv_base + at.slot() * Tr::slot_bytes;
  }
  __device__ __forceinline__ unsigned v_tile(tma::PipelineState<Tr::stages> at) const {
    return k_tile(at) + Tr::k_bytes;
  }

  // This warp is done with the K or V slot `at`: one arrival per warp.
  __device__ __forceinline__ void release(tma::Pipeline<Tr::stages>& pipeline,
                                          tma::PipelineState<Tr::stages> at) const {
    __syncwarp();
    if (lane == 0) pipeline.empty.arrive(at);
  }
  // Every thread is done with Q's slot (and the tile index it read).
  __device__ __forceinline__ void release_q() {
    bars.q.empty.arrive(q_at);
    q_at.advance();
  }
  // The product into o is in, and V's slot goes back.
  __device__ __forceinline__ void output_done(float (&o)[1][Tr::o_tiles][4],
                                              tma::PipelineState<Tr::stages> at) const {
    wgmma::wait<0>();
    pin_columns(o);
    release(bars.v, at);
  }
};

}  // namespace attention
}  // namespace kiln
