// SPDX-License-Identifier: Apache-2.0
// The tma kernel's shapes (the wgmma kernel's, plus its warpgroups' roles and registers) and the
// barriers its warpgroups meet at.
#pragma once

#include "attention/prefill/forward_wgmma.cuh"
#include "common/pipeline.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct TmaTraits : WgmmaTraits<Spec, true> {
  using Base = WgmmaTraits<Spec, true>;
  static constexpr int consumer_groups = Base::block_m / 64;
  static constexpr int consumer_threads = consumer_groups * 128;
  static constexpr int consumer_warps = consumer_threads / 32;
  static constexpr int threads = consumer_threads + 128;  // and the producer warpgroup
  // setmaxnreg counts (attention_forward_tma_producer_registers and _consumer_registers).
  static constexpr int producer_registers = attention_forward_tma_producer_registers(Base::block_m);
  static constexpr int consumer_registers = attention_forward_tma_consumer_registers(Base::block_m);
  static_assert(attention_forward_tma_least_registers(Base::block_m) <= 65536 / threads / 8 * 8,
                "the warpgroups' registers do not fit what the CTA is launched with.");
  static_assert(consumer_groups != 3 || consumer_registers == 160,
                "three consumer warpgroups must keep 160 registers each beside the producer.");

  // fp8 k and v under a 16-bit q: TMA lands each V block, and K's (widens_k) unless q is split,
  // in a staging entry of its own, whose 64-column chunks are block_n rows of 64 bytes swizzled
  // by 64 bytes (the map's box), and the producer warpgroup's other three warps (the converters,
  // tma/converter.cuh) widen it into its slot. Split (a bf16 q over e4m3 k and v), K lands in its
  // slot as the all-fp8 forward's does. fp8 q, k and v (q_fp8): K lands in its slot as Q does, in
  // 128-column chunks (64-column ones of 64 bytes at head dims to 64), and only V in an entry
  // (block_n rows of 128-byte chunks, swizzled by 128), which the converters transpose into its
  // slot: wgmma's fp8 operands are K-major, and P V reduces over keys.
  using Base::q_fp8;
  using Base::qk_size;
  static constexpr bool widens_k =
      attention_forward_tma_widens_k(Base::q_size, qk_size, Base::kv_size);
  static constexpr int fp8_entries = static_cast<int>(attention_forward_tma_fp8_entries(
      Base::head_dim, Base::head_dim_v, Base::block_m, Base::block_n, Base::stages, Base::q_size,
      qk_size, Base::kv_size, Base::out_size));
  static constexpr int entry_bytes = static_cast<int>(attention_forward_tma_fp8_entry_bytes(
      Base::head_dim, Base::head_dim_v, Base::block_n, Base::q_size, qk_size, Base::kv_size));
  static_assert(!Base::kv_fp8 ||
                    fp8_entries >= attention_forward_tma_least_fp8_entries(Base::stages,
                                                                           Base::q_size, qk_size,
                                                                           Base::kv_size),
                "fp8 k and v's staging entries do not fit beside the tiles: lower block_m, "
                "block_n or stages.");
  static constexpr int converter_warps = Base::kv_fp8 ? 3 : 0;
  // The columns of an entry's chunks (its map's box), and V's columns there.
  static constexpr int entry_columns = q_fp8 ? 128 : 64;
  static constexpr int entry_dim_v = round_up(Base::head_dim_v, entry_columns);
  // fp8 products: each block's P V goes to an accumulator of its own, added into o in fp32 before
  // the next (wgmma's fp8 products keep fewer bits as they accumulate), and the probabilities
  // count from 2^8 instead of 1 (OnlineSoftmax's Offset), so that e4m3 holds the small ones with
  // its normal precision.
  static constexpr int p_offset = q_fp8 ? 8 : 0;
  // Past 128 columns of V, or 128 keys a block, a block's P V has no registers of its own beside
  // o's (and the scores'): it is computed after the block's scores, not under them, 128 columns
  // at a time into the scores' first 64 registers.
  static constexpr bool split_pv = q_fp8 && (Base::v_dim > 128 || Base::block_n > 128);
  static_assert(!q_fp8 || Base::v_dim <= 128 || Base::block_n == 128,
                "with fp8 q, k and v and head_dim_v above 128 block_n must be 128: 128 columns of "
                "P V take the scores' registers, beside o's.");
  // Whether an output staging tile follows the Q and K/V tiles and the staging entries
  // (attention_forward_tma_staged).
  static constexpr bool staged = attention_forward_tma_staged(
      Base::head_dim, Base::head_dim_v, Base::block_m, Base::block_n, Base::stages, Base::q_size,
      qk_size, Base::kv_size, Base::out_size);
  static constexpr int entries_offset = Base::q_bytes + Base::stages * Base::slot_bytes;
  static constexpr int staging_offset = entries_offset + fp8_entries * entry_bytes;
  static_assert(1024 + staging_offset +
                        (staged ? Base::block_m * Base::v_pitch * Base::out_size : 0) <=
                    attention_forward_tma_smem_bytes(Base::head_dim, Base::head_dim_v,
                                                     Base::block_m, Base::block_n, Base::stages,
                                                     Base::q_size, qk_size, Base::kv_size,
                                                     Base::out_size),
                "attention_forward_tma_smem_bytes disagrees with the kernel's layout.");
};

// An fp8 q's descale for `seq`'s kv head, or 1 where the call gives none.
__device__ __forceinline__ float q_descale(const AttentionTmaParams& tp, const Sequence& seq) {
  return descale_or_one(tp.maybe_q_descale != nullptr
                            ? tp.maybe_q_descale + seq.batch * tp.q_descale_batch_stride +
                                  seq.head_kv * tp.q_descale_head_stride
                            : nullptr);
}

// What the producer hands the converters with each fp8 staging entry: the slot (its ring
// position) the block goes to, K's or V's (V's alone with fp8 q), and how many of its rows hold
// keys of the sequence (the rest of a V block is zeroed); or that no block is left.
struct Fp8Job {
  enum Kind : int { k, v, stop };
  int kind;
  int position;
  int rows;
};

// The fp8 staging entries' ring and jobs (none for 16-bit k and v).
template <int Entries>
struct Fp8Staging {
  tma::Pipeline<Entries> ring;
  Fp8Job job[Entries];

  // The producer's single arrival (with the loads' bytes) fills an entry; each converter warp's
  // empties it.
  __device__ __forceinline__ void init(unsigned converter_warps) { ring.init(1, converter_warps); }
};
template <>
struct Fp8Staging<0> {
  __device__ __forceinline__ void init(unsigned) {}
};

// A split q's consumer warps' largest magnitudes of their rows (tma/q_terms.cuh); none otherwise.
template <int Warps>
struct QAmax {
  float warp[Warps];
};
template <>
struct QAmax<0> {};

// What the producer, the converters (fp8 k and v) and the consumers meet at, in static shared
// memory. Q's slot is one stage that carries its tile's index: the consumers learn their next
// tile from it, and hand the slot back once the tile's last scores are in, so the next tile's Q
// loads under the tile's last product and its output stores. K and V of a slot have barriers of
// their own: a warpgroup is done with K once its scores are in, well before it is done with V, and
// the next K load need not wait for V.
template <class Tr>
struct TmaBarriers {
  int q_tile_index;  // written by the producer before it fills Q's slot (-1: none left)
  tma::Pipeline<1> q;
  tma::Pipeline<Tr::stages> k;
  tma::Pipeline<Tr::stages> v;
  // A V block that holds its sequence's last key lands here instead of v.full: the producer
  // zeroes its rows past that key, then arrives on v.full itself.
  tma::BarrierRing<1> v_tail;
  Fp8Staging<Tr::fp8_entries> fp8;
  QAmax<Tr::splits_q ? Tr::consumer_warps : 0> q_amax;

  // One thread, before a CTA barrier. The producer's single arrival (with the loads' bytes)
  // fills a slot, or where the converters fill it (fp8 V; K too where widened) each converter
  // warp's; Q's slot empties once every consumer thread read its tile index, a K or V slot once
  // every consumer warp is done with it.
  __device__ __forceinline__ void init() {
    q.init(1, Tr::consumer_threads);
    v_tail.init(1);
    k.init(Tr::widens_k ? Tr::converter_warps : 1, Tr::consumer_warps);
    v.init(Tr::kv_fp8 ? Tr::converter_warps : 1, Tr::consumer_warps);
    fp8.init(Tr::converter_warps);
    tma::fence_init();
  }
};

}  // namespace attention
}  // namespace kiln
