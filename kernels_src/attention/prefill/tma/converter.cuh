// SPDX-License-Identifier: Apache-2.0
// The tma kernel's converters, with fp8 k and v: the producer warpgroup's warps 1 to 3, which
// take the staging entries in the order the producer posts them, widen each K or V block to q's
// type (attention/core/fp8.cuh) into its slot in the 128-byte-swizzled layout TMA gives 16-bit
// blocks, and hand the slot to the consumers as the producer's loads would.
//
// A thread moves 16 columns of a row at a time: 16 bytes of the entry in, two 16-byte pieces of
// the slot out. Consecutive lanes take consecutive rows of the same 16 columns, so that the 8
// lanes of each quarter-warp access (16-byte loads and stores go a quarter-warp at a time) touch
// 8 distinct bank groups on both sides: entry rows of 64 bytes swizzled by 64 (piece
// q ^ (row / 2 % 4)), slot rows of 128 bytes swizzled by 128 (piece q ^ (row % 8)).
#pragma once

#include "attention/core/fp8.cuh"
#include "attention/prefill/tma/traits.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct TmaConverter {
  using Tr = TmaTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  // A lane's rows of a block, 32 apart, and how many it loads at once: 4 with the producer
  // warpgroup's 40 registers (beside two consumer warpgroups), 1 with its 32 (beside one or
  // three; 2 spilled 24 bytes beside three).
  static constexpr int row_steps = (Tr::block_n + 31) / 32;
  static constexpr int batch = Tr::producer_registers >= 40 ? 4 : 1;

  // Whether lane's row of step `step` is in the block.
  __device__ __forceinline__ static bool in_block(unsigned lane, int step) {
    return step < row_steps &&
           (Tr::block_n % 32 == 0 || static_cast<int>(lane) + 32 * step < Tr::block_n);
  }

  TmaBarriers<Tr>& bars;
  unsigned char* tiles;  // Q's slot, the K/V slots, then the staging entries
  int thread;            // 0 to converter_warps * 32 - 1

  // Every job the producer posts, until it posts the stop.
  __device__ __forceinline__ void run() {
    for (tma::PipelineState<Tr::fp8_entries> at{};; at.advance()) {
      bars.fp8.ring.full.wait(at);
      const Fp8Job job = read_job(at.slot());
      if (job.kind == Fp8Job::stop) return;
      const unsigned char* const entry = tiles + Tr::entries_offset + at.slot() * Tr::entry_bytes;
      const tma::PipelineState<Tr::stages> slot{job.position, job.position % Tr::stages};
      unsigned char* const slot_tile = tiles + Tr::q_bytes + slot.slot() * Tr::slot_bytes;
      tma::Pipeline<Tr::stages>& pipeline = job.kind == Fp8Job::k ? bars.k : bars.v;
      pipeline.acquire(slot);
      if (job.kind == Fp8Job::k) {
        widen<Tr::qk_dim, false>(slot_tile, entry, Tr::block_n);
      } else if (job.rows < Tr::block_n) {
        widen<Tr::v_dim, true>(slot_tile + Tr::k_bytes, entry, job.rows);
      } else {
        widen<Tr::v_dim, false>(slot_tile + Tr::k_bytes, entry, Tr::block_n);
      }
      wgmma::fence_shared_for_async();  // the slot's writes are visible to wgmma's reads
      __syncwarp();
      if (thread % 32 == 0) {
        bars.fp8.ring.empty.arrive(at);
        pipeline.full.arrive(slot);
      }
    }
  }

  // The job of entry `slot`, read by each warp's first lane, whose arrival on the entry's empty
  // barrier alone orders the read before the producer's next write there.
  __device__ __forceinline__ Fp8Job read_job(int slot) const {
    Fp8Job job{};
    if (thread % 32 == 0) job = bars.fp8.job[slot];
    return {__shfl_sync(0xffffffffu, job.kind, 0), __shfl_sync(0xffffffffu, job.position, 0),
            __shfl_sync(0xffffffffu, job.rows, 0)};
  }

  // The block's Dim columns of its first `rows` rows from the entry into the slot's tile; its
  // other rows (past the sequence's last key; Tail: there may be some) zeros. Warp w takes the
  // 16-column pieces w, w + 3, ..., and its lane l rows l, l + 32, ..., so that a lane's
  // swizzles stay put (rows 32 apart have the same row % 8) and its rows' loads are
  // independent.
  template <int Dim, bool Tail>
  __device__ __forceinline__ void widen(unsigned char* tile, const unsigned char* entry,
                                        int rows) const {
    const unsigned lane = static_cast<unsigned>(thread) % 32;
    const int warp = thread / 32;
#pragma unroll 1
    for (int piece = warp; piece < Dim / 16; piece += Tr::converter_warps) {
      const unsigned chunk = static_cast<unsigned>(piece) / 4, q = static_cast<unsigned>(piece) % 4;
      const unsigned char* const in =
          entry + (chunk * Tr::block_n + lane) * 64 + (q ^ (lane / 2 % 4)) * 16;
      unsigned char* const out = tile + (chunk * Tr::block_n + lane) * 128;
      const unsigned low = ((2 * q) ^ (lane % 8)) * 16, high = ((2 * q + 1) ^ (lane % 8)) * 16;
      // Rows in batches whose bytes are loaded first, so that the loads are in flight together
      // (as many as the producer warpgroup's registers hold); rows past `rows` (whatever the
      // entry holds there) are replaced by zeros once widened.
#pragma unroll
      for (int first = 0; first < row_steps; first += batch) {
        uint4 narrow[batch];
#pragma unroll
        for (int k = 0; k < batch; ++k) {
          if (in_block(lane, first + k)) {
            narrow[k] = *reinterpret_cast<const uint4*>(in + (first + k) * 32 * 64);
          }
        }
#pragma unroll
        for (int k = 0; k < batch; ++k) {
          if (!in_block(lane, first + k)) break;
          const int step = first + k;
          const uint2 a = fp8x4_to<Q, KV>(narrow[k].x), b = fp8x4_to<Q, KV>(narrow[k].y);
          const uint2 c = fp8x4_to<Q, KV>(narrow[k].z), d = fp8x4_to<Q, KV>(narrow[k].w);
          const bool key = !Tail || static_cast<int>(lane) + 32 * step < rows;
          *reinterpret_cast<uint4*>(out + step * 32 * 128 + low) =
              key ? make_uint4(a.x, a.y, b.x, b.y) : make_uint4(0, 0, 0, 0);
          *reinterpret_cast<uint4*>(out + step * 32 * 128 + high) =
              key ? make_uint4(c.x, c.y, d.x, d.y) : make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
};

}  // namespace attention
}  // namespace kiln
