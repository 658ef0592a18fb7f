// SPDX-License-Identifier: Apache-2.0
// Forward attention (FlashAttention-2): one CTA per (block_m query rows, head, batch) streams
// K/V tiles through a cp.async pipeline, mma.sync on tensor cores, online softmax in fp32.
//
// Spec constants (all of them change the generated code; everything else is in Params):
//   dtype_q, dtype_kv, dtype_out   of q (and bias), of k and v, and of out: kiln::f16 or
//                kiln::bf16, one of them for all three; or k and v in fp8 (kiln::e4m3 or
//                kiln::e5m2, sm_89 and newer, head dims multiples of 16), widened to q's type in
//                registers (attention/core/fp8.cuh), their descales in AttentionParams::descales.
//                Accumulation is fp32.
//   head_dim     of q and k, a multiple of 8 in [8, 256]; compiled for exactly this dim
//                (shared-memory tiles are zero-padded to the mma's 16; global memory past
//                head_dim is never read).
//   head_dim_v   of v and out, same rule (192/128 as in DeepSeek works).
//   block_m      query rows per CTA, a multiple of 16 * warps (each warp owns whole m16 tiles).
//   block_n      keys per pipeline step, a multiple of 16 in [16, 256].
//   warps        per CTA; the CTA has warps * 32 threads.
//   stages       K/V tile slots in shared memory, 1 to 4. 1: K and V loads alternate, each
//                hidden behind half a step (FlashAttention-2; least smem). 2+: K and V of
//                stages - 1 blocks in flight while one is used.
//   band         true: the runtime band (window_left, window_right, top_left) masks and skips
//                keys; causal is (-1, 0). false: only seqlen_k bounds the keys.
//   varlen       true: sequences come from cu_seqlens_q/k (tokens packed, no batch stride).
//   has_softcap  logits = softcap * tanh(scale * q.k / softcap).
//   has_alibi    logits -= slope * |i + offset - j|.
//   has_bias     logits += bias(b, h, i, j), any strides.
// LSE output and seqused_k are runtime options (null pointers when unused).
//
// Launch: grid (ceil(seqlen_q / block_m), heads, batch), where seqlen_q is the longest sequence
// for varlen; block warps * 32 threads; dynamic shared memory
// attention_forward_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size, kv_size,
// out_size) from "kiln/params/attention.h" (more than 48 KiB needs the function's
// max-dynamic-smem attribute).
// Do not launch an empty grid (seqlen_q == 0 or batch == 0): there is nothing to write.
//
// The configs choose() runs it with, and why, are its tuning tables kSm80 and (fp8 k and v) kFp8
// in lib/kernels/attention.cpp.
#pragma once

#include "attention/core/fp8.cuh"
#include "attention/core/kv_layout.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/softmax.cuh"
#include "attention/core/tile_io.cuh"
#include "attention/core/tile_mma.cuh"
#include "attention/core/traits.cuh"
#include "attention/prefill/logits.cuh"
#include "attention/prefill/sequence.cuh"
#include "common/mma.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention.h"

namespace kiln {
namespace attention {

// What a spec's constants imply for attention_forward (tiles, fragments, shared-memory layout),
// and the checks that refuse specs it cannot run.
template <class Spec>
struct ForwardTraits : HeadTraits<Spec, true> {
  using HeadTraits<Spec, true>::head_dim;
  using HeadTraits<Spec, true>::head_dim_v;
  using HeadTraits<Spec, true>::q_size;
  using HeadTraits<Spec, true>::kv_size;
  using HeadTraits<Spec, true>::out_size;
  using HeadTraits<Spec, true>::kv_fp8;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int stages = static_cast<int>(Spec::stages);
  static constexpr int threads = warps * 32;

  static_assert(warps >= 1 && warps <= 16, "warps must be between 1 and 16.");
  static_assert(block_m % (16 * warps) == 0,
                "block_m must be a multiple of 16 * warps: each warp owns whole m16 row tiles.");
  static_assert(block_m / (16 * warps) <= 4, "each warp may own at most 4 m16 row tiles.");
  static_assert(block_n % 16 == 0 && block_n >= 16 && block_n <= 256,
                "block_n must be a multiple of 16 from 16 to 256.");
  static_assert(stages >= 1 && stages <= 4, "stages must be 1, 2, 3 or 4.");

  // The mma consumes k in steps of 16, so the QK^T reduction dim is padded with zeros to 16;
  // the PV output dim too, which keeps ldmatrix.x4 pairs whole (padded columns are not stored).
  static constexpr int qk_dim = round_up(head_dim, 16);
  static constexpr int v_dim = round_up(head_dim_v, 16);
  // Smem rows carry 8 extra elements (16 bytes): with an odd number of 16-byte chunks per row,
  // the 8 rows one ldmatrix phase reads fall in 8 different bank groups.
  static constexpr int qk_pitch = qk_dim + 8;
  static constexpr int v_pitch = v_dim + 8;
  static constexpr int qk_swizzle = 1;  // padded tiles (see tile_offset)
  static constexpr int v_swizzle = 1;
  // K and V tiles: padded as Q's, or fp8 ones unpadded and swizzled by their 16-byte chunks
  // (rows of qk_dim and v_dim bytes, as fp8.cuh reads them).
  static constexpr int kv_qk_pitch = kv_fp8 ? qk_dim : qk_pitch;
  static constexpr int kv_v_pitch = kv_fp8 ? v_dim : v_pitch;
  static constexpr int kv_qk_swizzle = kv_fp8 ? swizzle_for(qk_dim / 16) : qk_swizzle;
  static constexpr int kv_v_swizzle = kv_fp8 ? swizzle_for(v_dim / 16) : v_swizzle;
  static_assert(!kv_fp8 || (head_dim % 16 == 0 && head_dim_v % 16 == 0),
                "fp8 k and v's head dims must be multiples of 16.");
  // An fp8 V's fragments leave o's columns in fp8_o_column's order.
  static constexpr bool fp8_o_columns = kv_fp8;

  static constexpr int rows_per_warp = block_m / warps;
  static constexpr int m_tiles = rows_per_warp / 16;  // m16 tiles per warp
  static constexpr int s_tiles = block_n / 8;         // n8 tiles of a score row block
  static constexpr int o_tiles = v_dim / 8;           // n8 tiles of an output row block

  // How many mma steps ahead of use qk_scores and pv_accumulate load ldmatrix fragments (0:
  // just in time). Measured on an H200 (dev notes): one step ahead gains 4-8% at head_dim 128
  // (two m16 tiles per warp), but loses 2-5% at head_dim 64 and does nothing or worse with one
  // m16 tile per warp (head_dim 256).
  static constexpr int prefetch = m_tiles >= 2 && qk_dim > 64 ? 1 : 0;

  // Shared memory: Q (q_elems elements of Q), then `stages` slots of (K tile, V tile), elements
  // of KV. The output is staged from offset 0 once the loop is done.
  static constexpr int q_elems = block_m * qk_pitch;
  static constexpr int k_elems = block_n * kv_qk_pitch;
  static constexpr int v_elems = block_n * kv_v_pitch;
  static constexpr int slot_elems = k_elems + v_elems;
  static constexpr int smem_bytes = static_cast<int>(attention_forward_smem_bytes(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, kv_size, out_size));
  static_assert(smem_bytes >= q_elems * q_size + stages * slot_elems * kv_size &&
                    smem_bytes >= block_m * v_pitch * out_size,
                "attention_forward_smem_bytes disagrees with the kernel's layout.");
  static_assert(smem_bytes <= 227 * 1024,
                "the tiles need more than 227 KiB of shared memory: lower block_m, block_n or "
                "stages.");
};

// The output tile through shared memory (reusing it from offset 0), so that global stores are
// whole 16-byte row pieces; o's columns in fp8_o_column's order after an fp8 V read in registers
// (Tr::fp8_o_columns).
template <class Tr>
__device__ __forceinline__ void stage_output(typename Tr::Out* smem,
                                             const float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                             int warp, int lane) {
  if constexpr (Tr::fp8_o_columns) {
    stage_fp8_fragments<Tr::v_pitch>(smem, o, warp * Tr::rows_per_warp, lane);
  } else {
    stage_fragments<Tr::v_pitch>(smem, o, warp * Tr::rows_per_warp, 0, lane);
  }
}

// Each quad's first lane writes the LSE of the quad's rows (row0 + 8 r), those in the sequence.
template <class Tr>
__device__ __forceinline__ void store_lse(float* lse_rows, const float (&lse)[2 * Tr::m_tiles],
                                          int row0, int seqlen_q, int lane) {
  if (lane % 4 != 0) return;
#pragma unroll
  for (int r = 0; r < 2 * Tr::m_tiles; ++r) {
    const int row = row0 + 8 * r;
    if (row < seqlen_q) lse_rows[row] = lse[r];
  }
}

// What the output is multiplied by as the softmax finishes: fp8 V's descale (per sequence and kv
// head), else 1.
template <class Tr>
__device__ __forceinline__ float output_scale(const AttentionParams& p, const Sequence& seq) {
  if constexpr (Tr::kv_fp8) {
    return descale_or_one(head_descales(p.descales, seq.batch, seq.head_kv).v);
  } else {
    return 1.f;
  }
}

// The end of a row block, for the kernels whose warps each own whole rows (mma, wgmma): every
// row's softmax finished with its sink, o times fp8 values' descale, staged through `staging`
// once every warp is done with the tiles there, then out and the LSE stored.
template <class Tr, class Transform, class Softmax>
__device__ __forceinline__ void store_row_block(const AttentionParams& p, const Sequence& seq,
                                                const RowBlock& rows, const Transform& transform,
                                                Softmax& softmax,
                                                float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                                float to_log2, typename Tr::Out* staging, int row0,
                                                int thread, int warp, int lane) {
  using Out = typename Tr::Out;
  float lse[2 * Tr::m_tiles];
  float sink[2 * Tr::m_tiles];
  transform.sinks(sink, p.score);
  softmax.template finish<Tr::kv_fp8>(o, to_log2, lse, sink, output_scale<Tr>(p, seq));

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done reading the tiles before the output overwrites them
  stage_output<Tr>(staging, o, warp, lane);
  __syncthreads();
  Out* const out = static_cast<Out*>(p.out) + seq.out_offset + rows.begin * p.out_seq_stride;
  store_tile<Tr::block_m, Tr::head_dim_v, Tr::v_pitch, Tr::threads>(out, p.out_seq_stride, staging,
                                                                    rows.end - rows.begin, thread);
  if (p.maybe_lse != nullptr)
    store_lse<Tr>(p.maybe_lse + seq.lse_offset, lse, row0, seq.seqlen_q, lane);
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::ForwardTraits<Spec>::threads)
    attention_forward(const KILN_GRID_CONSTANT AttentionParams p) {
  using namespace attention;
  using Tr = ForwardTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  Q* const smem_q = reinterpret_cast<Q*>(smem_bytes);
  KV* const smem_kv = reinterpret_cast<KV*>(smem_q + Tr::q_elems);

  const Tile tile = cta_tile<Spec, Tr::block_m, Tr::block_n>(p);
  const Sequence& seq = tile.seq;
  const RowBlock& rows = tile.rows;
  const Band& band = tile.band;
  const KeyBlocks& blocks = tile.blocks;
  if (rows.begin >= rows.end) return;
  const int row_begin = rows.begin;
  const int row_end = rows.end;

  const int thread = threadIdx.x;
  const int warp = thread / 32;
  const int lane = thread % 32;

  // This thread's first row within the sequence; its others are 8, 16, ... further.
  const int row0 = row_begin + warp * Tr::rows_per_warp + lane / 4;
  const auto transform =
      make_logit_transform<Spec, mma::ApproxMath, 2 * Tr::m_tiles>(p, seq, band, row0);
  const float to_log2 = transform.to_log2();

  const Q* const q = static_cast<const Q*>(p.q) + seq.q_offset + row_begin * p.q_seq_stride;
  const auto kv = sequence_kv<Spec, KV>(p, seq);
  auto load_k = [&](int block, int slot) {
    const int key0 = block * Tr::block_n;
    load_tile_async<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::kv_qk_pitch, Tr::threads,
                    Tr::kv_qk_swizzle>(smem_kv + slot * Tr::slot_elems,
                                       kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride,
                                       seq.seqlen_k - key0, thread);
  };
  auto load_v = [&](int block, int slot) {
    const int key0 = block * Tr::block_n;
    load_tile_async<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::kv_v_pitch, Tr::threads,
                    Tr::kv_v_swizzle>(smem_kv + slot * Tr::slot_elems + Tr::k_elems,
                                      kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride,
                                      seq.seqlen_k - key0, thread);
  };

  // Prologue. Q joins the first group (with fp8 k and v, a group of its own, put into the order of
  // their K fragments once it lands). With one stage K and V alternate (FlashAttention-2):
  // V of a block loads during its QK^T, K of the next during its softmax and PV. With more,
  // K and V of a block travel together and stages - 1 groups, empty or not, stay in flight,
  // so that the loop's wait count is one constant.
  load_tile_async<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
      smem_q, q, p.q_seq_stride, row_end - row_begin, thread);
  if constexpr (Tr::kv_fp8) mma::cp_async_commit();
  if constexpr (Tr::stages == 1) {
    if (blocks.begin < blocks.end) load_k(blocks.begin, 0);
    mma::cp_async_commit();
  } else {
#pragma unroll
    for (int stage = 0; stage < Tr::stages - 1; ++stage) {
      if (blocks.begin + stage < blocks.end) {
        load_k(blocks.begin + stage, stage);
        load_v(blocks.begin + stage, stage);
      }
      mma::cp_async_commit();
    }
  }
  if constexpr (Tr::kv_fp8) {
    mma::cp_async_wait<Tr::stages == 1 ? 1 : Tr::stages - 1>();  // Q's group, not the tiles'
    __syncthreads();
    permute_q_for_fp8_k<Tr, Tr::block_m, Tr::threads>(smem_q, thread);
    // The loop's first barrier orders these writes before the first product reads Q.
  }

  const LaneOffsets lanes = lane_offsets<Tr>(warp * Tr::rows_per_warp, lane);
  const unsigned q_lane = mma::smem_address(smem_q) + lanes.q;
  const unsigned kv_base = mma::smem_address(smem_kv);

  float o[Tr::m_tiles][Tr::o_tiles][4];
  zero_fragments(o);
  OnlineSoftmax<Tr::m_tiles> softmax;
  softmax.init();

  int read_slot = 0;
  for (int block = blocks.begin; block < blocks.end; ++block) {
    if constexpr (Tr::stages == 1) {
      mma::cp_async_wait<0>();
      __syncthreads();  // K is visible to all, and every warp is done reading the last V
      load_v(block, 0);
      mma::cp_async_commit();
    } else {
      mma::cp_async_wait<Tr::stages - 2>();
      __syncthreads();  // the tile is visible to all, and every warp is done with the oldest slot
      const int write_slot = read_slot == 0 ? Tr::stages - 1 : read_slot - 1;
      if (block + Tr::stages - 1 < blocks.end) {
        load_k(block + Tr::stages - 1, write_slot);
        load_v(block + Tr::stages - 1, write_slot);
      }
      mma::cp_async_commit();
    }

    const unsigned k_tile = kv_base + Tr::kv_size * read_slot * Tr::slot_elems;
    const unsigned v_tile = k_tile + Tr::kv_size * Tr::k_elems;
    float s[Tr::m_tiles][Tr::s_tiles][4];
    if constexpr (Tr::kv_fp8) {
      qk_scores_fp8<Tr>(s, q_lane, k_tile, lanes, lane);
    } else {
      qk_scores<Tr>(s, q_lane, k_tile + lanes.k, lanes);
    }

    const int key0 = block * Tr::block_n + 2 * (lane % 4);
    transform.apply(s, key0, blocks.needs_mask(block, Tr::block_n),
                    [&] { mask_logits(s, band, row0, key0); });
    if constexpr (Tr::stages == 1) {
      mma::cp_async_wait<0>();
      __syncthreads();  // V is visible to all, and every warp is done reading K
      if (block + 1 < blocks.end) load_k(block + 1, 0);
      mma::cp_async_commit();
    }
    softmax.update(s, o, to_log2);
    if constexpr (Tr::kv_fp8) {
      pv_accumulate_fp8<Tr>(o, s, v_tile, lane);
    } else {
      pv_accumulate<Tr>(o, s, v_tile + lanes.v, lanes);
    }

    if constexpr (Tr::stages > 1) read_slot = read_slot == Tr::stages - 1 ? 0 : read_slot + 1;
  }

  store_row_block<Tr>(p, seq, rows, transform, softmax, o, to_log2,
                      reinterpret_cast<typename Tr::Out*>(smem_bytes), row0, thread, warp, lane);
}

}  // namespace kiln
