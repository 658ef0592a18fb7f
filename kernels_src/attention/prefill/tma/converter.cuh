// SPDX-License-Identifier: Apache-2.0
// The tma kernel's converters, with fp8 k and v: the producer warpgroup's warps 1 to 3, which
// take the staging entries in the order the producer posts them, and hand each slot to the
// consumers as the producer's loads would. Under a 16-bit q they widen each V block, and K's
// unless q is split (tma/q_terms.cuh), to q's type (attention/core/fp8.cuh) into its slot in the
// 128-byte-swizzled layout TMA gives 16-bit blocks; with fp8 q, k and v they transpose each V
// block into its slot, K-major as wgmma's fp8 operands must be.
//
// Widening, a thread moves 16 columns of a row at a time: 16 bytes of the entry in, two 16-byte
// pieces of the slot out. Consecutive lanes take consecutive rows of the same 16 columns, so that
// the 8 lanes of each quarter-warp access (16-byte loads and stores go a quarter-warp at a time)
// touch 8 distinct bank groups on both sides: entry rows of 64 bytes swizzled by 64 (piece
// q ^ (row / 2 % 4)), slot rows of 128 bytes swizzled by 128 (piece q ^ (row % 8)).
//
// Transposing, a thread takes 4 columns (dims) of 16 keys at a time: 16 4-byte loads, one a key,
// where the warp's lanes read one 128-byte row together, then byte permutes, then a 16-byte
// store a dim. Lanes store their dims in rotated orders, so that the 8 lanes of a quarter-warp
// store rows of 8 distinct row % 8, whose pieces the swizzle puts in distinct bank groups.
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
      if constexpr (Tr::q_fp8) {
        if (job.rows < Tr::block_n) {
          transpose<true>(slot_tile + Tr::k_bytes, entry, job.rows);
        } else {
          transpose<false>(slot_tile + Tr::k_bytes, entry, Tr::block_n);
        }
      } else if (job.kind == Fp8Job::k) {
        if constexpr (Tr::widens_k) widen<Tr::qk_dim, false>(slot_tile, entry, Tr::block_n);
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

  // The V block's head_dim_v columns of its first `rows` keys from the entry (block_n rows of
  // 128-byte chunks, swizzled by 128) into the slot's V tile transposed: v_dim rows (dims) of
  // block_n keys, in 128-key chunks swizzled by 128, keys past `rows` zeros (Tail: there may be
  // some). Within each 16 keys the order is that of P's A fragments (p_key below). A warp takes
  // 32 (dim group, key group) units at a time: 4 dims of 16 keys, lane l dim group l of the
  // block's (v_dim / 4, taken 32 at a time) and warps taking turns at key groups.
  template <bool Tail>
  __device__ __forceinline__ void transpose(unsigned char* tile, const unsigned char* entry,
                                            int rows) const {
    constexpr int dim_groups = Tr::v_dim / 4;
    constexpr int units = dim_groups * (Tr::block_n / 16);
    const unsigned lane = static_cast<unsigned>(thread) % 32;
    const int warp = thread / 32;
    // This lane's dims, d0 .. d0 + 3, leave in the order d0 + (i + turn) % 4 for i = 0 .. 3:
    // first-stage permutes pick bytes (turn + 2 h, turn + 2 h + 1) % 4 of the two words.
    const unsigned turn = (lane >> 1) & 3;
    const unsigned b0 = turn, b1 = (turn + 1) & 3, b2 = (turn + 2) & 3, b3 = (turn + 3) & 3;
    const unsigned pick_low = b0 | (b0 + 4) << 4 | b1 << 8 | (b1 + 4) << 12;
    const unsigned pick_high = b2 | (b2 + 4) << 4 | b3 << 8 | (b3 + 4) << 12;
#pragma unroll 1
    for (int unit = warp * 32 + static_cast<int>(lane); unit < units;
         unit += Tr::converter_warps * 32) {
      const int dims = unit % dim_groups * 4, keys = unit / dim_groups * 16;
      // Row (key) r's 4 bytes at dims: chunk dims / 128, piece dims % 128 / 16 ^ r % 8.
      const unsigned char* const in = entry + (dims / 128 * Tr::block_n + keys) * 128 + dims % 16;
      const unsigned piece = static_cast<unsigned>(dims % 128 / 16);
      unsigned word[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        word[r] = *reinterpret_cast<const unsigned*>(in + r * 128 + ((piece ^ (r % 8)) * 16));
        if (Tail && keys + r >= rows) word[r] = 0;
      }
      // Output word q of each dim's piece holds keys 2q, 2q + 1, 2q + 8, 2q + 9 (p_key).
      unsigned out[4][4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const unsigned low01 = __byte_perm(word[2 * q], word[2 * q + 1], pick_low);
        const unsigned high01 = __byte_perm(word[2 * q], word[2 * q + 1], pick_high);
        const unsigned low89 = __byte_perm(word[2 * q + 8], word[2 * q + 9], pick_low);
        const unsigned high89 = __byte_perm(word[2 * q + 8], word[2 * q + 9], pick_high);
        out[0][q] = __byte_perm(low01, low89, 0x5410);
        out[1][q] = __byte_perm(low01, low89, 0x7632);
        out[2][q] = __byte_perm(high01, high89, 0x5410);
        out[3][q] = __byte_perm(high01, high89, 0x7632);
      }
      unsigned char* const chunk = tile + keys / 128 * Tr::v_dim * 128;
      const unsigned key_piece = static_cast<unsigned>(keys % 128 / 16);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const unsigned dim = static_cast<unsigned>(dims) + ((static_cast<unsigned>(i) + turn) & 3);
        *reinterpret_cast<uint4*>(chunk + dim * 128 + ((key_piece ^ (dim % 8)) * 16)) =
            make_uint4(out[i][0], out[i][1], out[i][2], out[i][3]);
      }
    }
  }
};

}  // namespace attention
}  // namespace kiln
