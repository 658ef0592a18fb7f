// SPDX-License-Identifier: Apache-2.0
// The tma kernel's producer: one warp that takes the tiles from the scheduler and, for each,
// hands Q's slot to it and streams Q, then K and V of its key blocks, into the swizzled slots
// with TMA (fp8 k and v into staging entries, with a job for the converters that widen them into
// the slots; where q is split, V alone; with fp8 q, k and v, V alone, which they transpose). Its
// first lane issues every copy; the whole warp zeroes V's tails (fp8's: the converters).
#pragma once

#include "attention/core/kv_layout.cuh"
#include "attention/prefill/tma/tile_order.cuh"
#include "attention/prefill/tma/traits.cuh"
#include "common/tile_scheduler.cuh"

namespace kiln {
namespace attention {

// A tile's place in the tensor maps' (column, token, head, batch) coordinates: varlen sequences
// are packed along the token dim of batch 0.
struct MapCoords {
  int q_token;  // the tile's first query row
  int k_token;  // the sequence's first key
  int head;
  int head_kv;
  int batch;
};

template <class Spec>
struct TmaProducer {
  using Tr = TmaTraits<Spec>;

  const AttentionTmaParams& tp;
  TmaBarriers<Tr>& bars;
  unsigned char* tiles;  // Q's slot, the K/V slots, then the fp8 staging entries
  int lane;
  bool issuer;
  tma::PipelineState<1> q_at{};
  tma::PipelineState<Tr::stages> kv_at{};  // the next tile's first key block: its K and its V
  tma::PipelineState<1> tail_at{};
  tma::PipelineState<Tr::kv_fp8 ? Tr::fp8_entries : 1> entry_at{};

  __device__ __forceinline__ TmaProducer(const AttentionTmaParams& tp_, TmaBarriers<Tr>& bars_,
                                         unsigned char* tiles_, int lane_)
      : tp(tp_), bars(bars_), tiles(tiles_), lane(lane_), issuer(lane_ == 0) {}

  // Every tile the scheduler hands out, then -1 in Q's slot: the consumers stop.
  __device__ __forceinline__ void run(const TileOrder<Spec, Tr::block_m, Tr::block_n>& order) {
    if (issuer) {
      tma::prefetch_map(&tp.q_map);
      tma::prefetch_map(&tp.k_map);
      tma::prefetch_map(&tp.v_map);
    }
    const TileScheduler scheduler{tp.maybe_tile_counter};
    for (int index = scheduler.first(); index < order.count(); index = scheduler.next(index)) {
      const Tile tile = order.tile(index);
      if (tile.rows.begin >= tile.rows.end) continue;
      const MapCoords coords = map_coords(tile);
      hand_over(index);
      load_q(coords);
      // K runs a block ahead of V: the consumers need block j + 1's K for its scores while block
      // j's V is still in use, so K's load need not wait for a V slot to come free. Block b's K
      // and V take the ring position b - first past kv_at, the tile's first block's.
      const int first = tile.blocks.begin;
      for (int block = first; block <= tile.blocks.end; ++block) {
        const tma::PipelineState<Tr::stages> k_at = kv_at.after(block - first);
        if (block < tile.blocks.end) load_k(block, k_at, coords);
        if (block > first) load_v(block - 1, k_at.after(-1), tile.seq, coords);
      }
      kv_at = kv_at.after(tile.blocks.end - first);
    }
    hand_over(-1);
    if (issuer) {
      bars.q.full.arrive(q_at);
      scheduler.finish();
    }
    if constexpr (Tr::kv_fp8) {
      if (issuer) {
        post(Fp8Job{Fp8Job::stop, 0, 0});
        bars.fp8.ring.full.arrive(entry_at);
      }
    }
  }

  __device__ __forceinline__ MapCoords map_coords(const Tile& tile) const {
    const AttentionParams& p = tp.p;
    const Sequence& seq = tile.seq;
    const KVTmaCoords kv = kv_tma_coords<tensor_mode(Spec::varlen)>(p.kv, seq.batch);
    return {(Spec::varlen ? p.maybe_cu_seqlens_q[seq.batch] : 0) + tile.rows.begin, kv.token0,
            seq.head, seq.head / (p.heads / p.heads_kv), kv.batch};
  }

  // Q's slot to the tile `index`, once the consumers are done with the last one's.
  __device__ __forceinline__ void hand_over(int index) {
    if (issuer) {
      bars.q.acquire(q_at);
      bars.q_tile_index = index;
    }
  }

  __device__ __forceinline__ void load_q(const MapCoords& coords) {
    if (issuer) {
      bars.q.full.arrive_expect_tx(q_at, Tr::block_m * Tr::q_dim * Tr::q_size);
#pragma unroll
      for (int c = 0; c < Tr::q_dim / Tr::q_chunk_columns; ++c) {
        tma::load_4d(tiles + c * Tr::block_m * Tr::q_chunk_bytes, &tp.q_map, bars.q.full.at(q_at),
                     Tr::q_chunk_columns * c, coords.q_token, coords.head, coords.batch);
      }
    }
    q_at.advance();
  }

  __device__ __forceinline__ unsigned char* slot_tile(int slot) const {
    return tiles + Tr::q_bytes + slot * Tr::slot_bytes;
  }

  // fp8 k and v: the next staging entry, once the converters are done with it, to `job`; the
  // caller arrives on its full barrier.
  __device__ __forceinline__ unsigned char* post(const Fp8Job& job) {
    bars.fp8.ring.acquire(entry_at);
    bars.fp8.job[entry_at.slot()] = job;
    return tiles + Tr::entries_offset + entry_at.slot() * Tr::entry_bytes;
  }

  // fp8 k or v: block `block`'s Dim columns from `map` into the next staging entry, for the
  // converters to widen (or transpose) into the slot at ring position `position` (job's).
  template <int Dim>
  __device__ __forceinline__ void load_fp8(const TensorMap* map, const Fp8Job& job, int block,
                                           const MapCoords& coords) {
    if (issuer) {
      unsigned char* const entry = post(job);
      bars.fp8.ring.full.arrive_expect_tx(entry_at, Tr::block_n * Dim);
#pragma unroll
      for (int c = 0; c < Dim / Tr::entry_columns; ++c) {
        tma::load_4d(entry + c * Tr::block_n * Tr::entry_columns, map,
                     bars.fp8.ring.full.at(entry_at), Tr::entry_columns * c,
                     coords.k_token + block * Tr::block_n, coords.head_kv, coords.batch);
      }
    }
    entry_at.advance();
  }

  __device__ __forceinline__ void load_k(int block, tma::PipelineState<Tr::stages> k_at,
                                         const MapCoords& coords) {
    if constexpr (Tr::widens_k) {
      load_fp8<Tr::qk_dim>(&tp.k_map, Fp8Job{Fp8Job::k, k_at.count, Tr::block_n}, block, coords);
      return;
    }
    if (issuer) {
      bars.k.acquire(k_at);
      bars.k.full.arrive_expect_tx(k_at, Tr::k_bytes);
      unsigned char* const k_tile = slot_tile(k_at.slot());
#pragma unroll
      for (int c = 0; c < Tr::qk_dim / Tr::chunk_columns; ++c) {
        tma::load_4d(k_tile + c * Tr::block_n * Tr::chunk_bytes, &tp.k_map, bars.k.full.at(k_at),
                     Tr::chunk_columns * c, coords.k_token + block * Tr::block_n, coords.head_kv,
                     coords.batch);
      }
    }
  }

  // Keys past the sequence's end get probability 0, but 0 times a NaN or infinity in their V
  // rows (another sequence's, or memory the caller never wrote) is NaN: the block holding the
  // last key is zeroed past it, as the wgmma kernel's loads do, before the consumers see it.
  // (K needs nothing: masking replaces those logits whatever they are.)
  __device__ __forceinline__ void load_v(int block, tma::PipelineState<Tr::stages> v_at,
                                         const Sequence& seq, const MapCoords& coords) {
    unsigned char* const v_tile = slot_tile(v_at.slot()) + Tr::k_bytes;
    const int valid = seq.seqlen_k - block * Tr::block_n;
    const bool tail = valid < Tr::block_n;
    if constexpr (Tr::kv_fp8) {
      const int rows = tail ? (valid > 0 ? valid : 0) : Tr::block_n;
      load_fp8<Tr::q_fp8 ? Tr::entry_dim_v : Tr::v_dim>(
          &tp.v_map, Fp8Job{Fp8Job::v, v_at.count, rows}, block, coords);
      return;
    }
    unsigned long long* const landed = tail ? bars.v_tail.at(tail_at) : bars.v.full.at(v_at);
    if (issuer) {
      bars.v.acquire(v_at);
      tma::arrive_expect_tx(landed, Tr::slot_bytes - Tr::k_bytes);
#pragma unroll
      for (int c = 0; c < Tr::v_dim / 64; ++c) {
        tma::load_4d(v_tile + c * Tr::block_n * 128, &tp.v_map, landed, 64 * c,
                     coords.k_token + block * Tr::block_n, coords.head_kv, coords.batch);
      }
    }
    if (tail) {
      bars.v_tail.wait(tail_at);
      tail_at.advance();
      // Whole 128-byte rows: the swizzle only moves pieces within a row.
      constexpr int pieces = Tr::block_n * 8;  // per 64-column chunk
      for (int c = 0; c < Tr::v_dim / 64; ++c) {
        uint4* const chunk = reinterpret_cast<uint4*>(v_tile + c * Tr::block_n * 128);
        for (int piece = valid * 8 + lane; piece < pieces; piece += 32) {
          chunk[piece] = make_uint4(0, 0, 0, 0);
        }
      }
      wgmma::fence_shared_for_async();  // the zeros are visible to wgmma's reads
      __syncwarp();
      if (issuer) bars.v.full.arrive(v_at);
    }
  }
};

}  // namespace attention
}  // namespace kiln
