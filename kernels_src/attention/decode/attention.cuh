// SPDX-License-Identifier: Apache-2.0
// Decode attention (flash-decoding): a few query rows per sequence against a long KV cache,
// contiguous or paged, its keys split across CTAs and, within a CTA, across warps.
//
// GQA packing (packing.cuh): the query rows that share a kv head are packed rows, 16 * m_tiles
// to a CTA, so each K/V tile feeds all of them through the tensor cores and is read from memory
// once.
//
// Each warp streams its own K/V tiles (block_n keys, `stages` cp.async slots) with no CTA-wide
// barrier in the loop: warp w takes tiles w, w + warps, ... of the CTA's key range. At the end
// the warps' online-softmax states are merged through shared memory. With one split the CTA
// writes out (and lse). With more, each CTA writes an fp32 partial state and flags it with the
// call's tag (publish_split); a split that finds all of its row block's flags set merges the
// states into out, so split-KV takes one launch.
//
// K and V go through the L2 marked evict-first (mma::L2::stream): read once, they would
// otherwise push out what the end of the kernel needs from there, its code and the split
// states. That end runs with one warp per scheduler, so it is all latency: its row offsets
// are worked out before the loop and its math is MUFU approximations.
//
// Spec constants (all change the generated code):
//   dtype_q, dtype_kv, dtype_out   kiln::f16 or kiln::bf16, one of them for all three: of q,
//                of the cache, and of out; fp32 accumulation. Or an fp8 cache (kiln::e4m3 or
//                kiln::e5m2, sm_89 and newer, head dims multiples of 16): its fragments are
//                widened to q's type in registers (attention/core/fp8.cuh), the keys' descale
//                joins the softmax scale and the values' multiplies the output.
//   token_descales   an fp8 cache's descales per (token, kv head) (DecodeParams::token_descale):
//                each tile's come with it into shared memory; the keys' multiply S's columns,
//                the values' (times the kv head's) dequantize V as it is widened, rounded once.
//   head_dim     of q and k, head_dim_v of v and out: multiples of 8 in [8, 256].
//   m_tiles      packed rows per CTA / 16: 1, 2 or 4.
//   block_n      keys per warp tile, a multiple of 16.
//   warps        per CTA.
//   stages       cp.async slots per warp, 2 to 8.
//   paged        keys go through the block table.
//   band         the runtime band (window_left, window_right, top_left) masks keys.
//   has_softcap, has_alibi   as in the forward kernel.
//
// Launch: grid (row_blocks * num_splits, heads_kv, batch) with row_blocks =
// ceil(seqlen_q * heads / heads_kv / (16 * m_tiles)); block warps * 32 threads; dynamic shared
// memory attention_decode_smem_bytes(head_dim, head_dim_v, m_tiles, block_n, warps, stages,
// q_size, kv_size, token_descales);
// LaunchConfig::overlap_previous (it waits for the previous grid first).
#pragma once

#include "attention/core/fp8.cuh"
#include "attention/core/kv_layout.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/softmax.cuh"
#include "attention/core/tile_io.cuh"
#include "attention/core/tile_mma.cuh"
#include "attention/core/traits.cuh"
#include "attention/decode/merge_state.cuh"
#include "attention/decode/packing.cuh"
#include "common/mma.cuh"
#include "common/prelude.cuh"
#include "kiln/params/decode.h"

namespace kiln {
namespace decode {

template <class Spec>
struct DecodeTraits : attention::HeadTraits<Spec, true> {
  using attention::HeadTraits<Spec, true>::head_dim;
  using attention::HeadTraits<Spec, true>::head_dim_v;
  using attention::HeadTraits<Spec, true>::q_size;
  using attention::HeadTraits<Spec, true>::kv_size;
  using attention::HeadTraits<Spec, true>::kv_fp8;

  static constexpr int m_tiles = static_cast<int>(Spec::m_tiles);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int stages = static_cast<int>(Spec::stages);
  static constexpr int threads = warps * 32;

  static_assert(m_tiles == 1 || m_tiles == 2 || m_tiles == 4, "m_tiles must be 1, 2 or 4.");
  static_assert(block_n % 16 == 0 && block_n >= 16 && block_n <= 128,
                "block_n must be a multiple of 16 from 16 to 128.");
  static_assert(warps >= 1 && warps <= 16, "warps must be between 1 and 16.");
  static_assert(stages >= 2 && stages <= 8, "stages must be between 2 and 8.");

  static constexpr int rows = 16 * m_tiles;  // packed query rows per CTA
  static constexpr int qk_dim = attention::round_up(head_dim, 16);
  static constexpr int v_dim = attention::round_up(head_dim_v, 16);
  // Swizzled tiles (traits.cuh): unpadded rows keep the streaming cp.async requests whole.
  static constexpr int qk_pitch = qk_dim;
  static constexpr int v_pitch = v_dim;
  static constexpr int qk_swizzle = attention::swizzle_for(qk_dim / 8);
  static constexpr int v_swizzle = attention::swizzle_for(v_dim / 8);
  // The cache's tiles as loaded: 16-byte chunks of kv_chunk elements, swizzled by their count.
  static constexpr int kv_chunk = 16 / kv_size;
  static constexpr int kv_qk_swizzle = attention::swizzle_for(qk_dim / kv_chunk);
  static constexpr int kv_v_swizzle = attention::swizzle_for(v_dim / kv_chunk);
  static_assert(!kv_fp8 || (head_dim % 16 == 0 && head_dim_v % 16 == 0),
                "an fp8 cache's head dims must be multiples of 16.");
  static constexpr int s_tiles = block_n / 8;
  static constexpr int o_tiles = v_dim / 8;
  static constexpr int prefetch = 0;  // memory-bound: fragments just in time
  // __launch_bounds__'s blocks per SM. NOTE: 0 means unset, leaving ptxas its own register
  // target (the 16-bit kernels' code as tuned). With an fp8 cache that target was 128 registers
  // at head dim 128, with spills; 1 lets ptxas take the about 160 the kernel needs.
  static constexpr int min_blocks = kv_fp8 ? 1 : 0;
  static constexpr bool token_descales = Spec::token_descales;
  static_assert(!token_descales || kv_fp8, "descales per token are an fp8 cache's.");

  // Shared memory: Q (q_elems elements of Q), then per warp `stages` slots of (K tile, V tile),
  // elements of KV, and with token_descales the tile's key then value descales (fp32, from
  // element descales_at). The warp merge at the end reuses it as fp32: per warp rows x
  // merge_pitch outputs, then every warp's row maxima and sums.
  static constexpr int q_elems = rows * qk_pitch;
  static constexpr int k_elems = block_n * qk_pitch;
  static constexpr int descales_at = k_elems + block_n * v_pitch;
  static constexpr int slot_elems = descales_at + (token_descales ? 2 * block_n * 4 / kv_size : 0);
  static constexpr int warp_elems = stages * slot_elems;
  // float2 stores of 8 rows meet no bank twice (the fp8 path's float4 ones, once a CTA, do).
  static constexpr int merge_pitch = v_dim + 8;
  static constexpr int smem_bytes = static_cast<int>(attention_decode_smem_bytes(
      head_dim, head_dim_v, m_tiles, block_n, warps, stages, q_size, kv_size, token_descales));
  static_assert(smem_bytes >= q_elems * q_size + warps * warp_elems * kv_size &&
                    smem_bytes >= 4 * warps * rows * (merge_pitch + 2),
                "attention_decode_smem_bytes disagrees with the kernel's layout.");
  static_assert(smem_bytes <= 227 * 1024,
                "the tiles need more than 227 KiB of shared memory: lower warps, block_n or "
                "stages.");
};

// Starts one warp's copy of keys [key0, key0 + Rows) into rows [0, Rows) of a slot's K and V
// tiles, as two strided tiles (a contiguous cache, or rows within one page), one pointer step per
// row pass: the tile's rows from its first key's, rows at or past `valid` zero-filled without
// being read.
template <class Tr, int Rows, attention::KVMode Mode>
__device__ __forceinline__ void load_kv_strided(
    typename Tr::KV* k_slot, typename Tr::KV* v_slot,
    const attention::KVRows<Mode, const typename Tr::KV>& c,
    const attention::KVTileRows<Mode, const typename Tr::KV>& tile, int valid, int lane) {
  long long k_off, v_off;
  tile.offsets(0, k_off, v_off);
  attention::load_tile_async<Rows, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, 32, Tr::kv_qk_swizzle,
                             mma::L2::stream>(k_slot, c.k + k_off, c.k_seq_stride, valid, lane);
  attention::load_tile_async<Rows, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, 32, Tr::kv_v_swizzle,
                             mma::L2::stream>(v_slot, c.v + v_off, c.v_seq_stride, valid, lane);
}

// As load_kv_strided for rows that cross pages: each lane looks up the page of each row it
// copies.
template <class Tr, int Rows, attention::KVMode Mode>
__device__ __forceinline__ void load_kv_by_key(
    typename Tr::KV* k_slot, typename Tr::KV* v_slot,
    const attention::KVRows<Mode, const typename Tr::KV>& c, int key0, int valid, int lane) {
  constexpr int k_chunks = Tr::qk_dim / Tr::kv_chunk;  // 16-byte chunks per padded row
  constexpr int v_chunks = Tr::v_dim / Tr::kv_chunk;
  constexpr int k_count = (Rows * k_chunks + 31) / 32;
  constexpr int v_count = (Rows * v_chunks + 31) / 32;
#pragma unroll
  for (int i = 0; i < (k_count > v_count ? k_count : v_count); ++i) {
    const int k_chunk = lane + 32 * i;
    const int k_row = k_chunk / k_chunks;
    const int k_col = k_chunk % k_chunks * Tr::kv_chunk;
    long long k_off = 0, v_off = 0;
    const bool k_in = k_row < Rows && k_row < valid;
    if (k_in) c.offsets(key0 + k_row, k_off, v_off);
    if (i < k_count && (Rows * k_chunks % 32 == 0 || k_row < Rows)) {
      const bool ok = k_in && k_col < Tr::head_dim;
      mma::cp_async_16<mma::L2::stream>(
          mma::smem_address(
              k_slot +
              attention::tile_offset<Tr::qk_pitch, Tr::kv_qk_swizzle, Tr::kv_chunk>(k_row, k_col)),
          ok ? c.k + k_off + k_col : c.k, ok);
    }
    const int v_chunk = lane + 32 * i;
    const int v_row = v_chunk / v_chunks;
    const int v_col = v_chunk % v_chunks * Tr::kv_chunk;
    if (i < v_count && (Rows * v_chunks % 32 == 0 || v_row < Rows)) {
      const bool v_in = v_row < valid;
      if (k_chunks != v_chunks && v_in) c.offsets(key0 + v_row, k_off, v_off);
      const bool ok = v_in && v_col < Tr::head_dim_v;
      mma::cp_async_16<mma::L2::stream>(
          mma::smem_address(
              v_slot +
              attention::tile_offset<Tr::v_pitch, Tr::kv_v_swizzle, Tr::kv_chunk>(v_row, v_col)),
          ok ? c.v + v_off + v_col : c.v, ok);
    }
  }
}

// Starts one warp's copy of keys [key0, key0 + block_n) into a slot: K rows then V rows, rows at
// or past `valid` zero-filled without being read. A tile in one stretch of rows (contiguous
// cache, or within one page) goes as two strided tiles. A paged tile across pages goes in
// pieces of 16 keys, each strided when it lies within one page (page sizes that are multiples
// of 16, from a key a multiple of 16: a 32-key tile over pages of 16 costs two block-table reads,
// not one per key), otherwise key by key.
template <class Tr, attention::KVMode Mode>
__device__ __forceinline__ void load_kv_tile(
    typename Tr::KV* slot, const attention::KVRows<Mode, const typename Tr::KV>& c, int key0,
    int valid, int lane) {
  using T = typename Tr::KV;
  T* const v_slot = slot + Tr::k_elems;
  const attention::KVTileRows<Mode, const T> tile(c, key0, min(valid, Tr::block_n));
  // NOTE: a condition the front end folds (not a call), so that no per-key path is emitted for a
  // contiguous cache: with one, the optimiser took another path, and the machine code changed.
  if (Mode != attention::KVMode::paged || tile.in_page >= 0) {
    load_kv_strided<Tr, Tr::block_n>(slot, v_slot, c, tile, valid, lane);
    return;
  }
  constexpr int piece = 16;
  if constexpr (Tr::block_n > piece) {
#pragma unroll
    for (int i = 0; i < Tr::block_n / piece; ++i) {
      T* const k_piece = slot + i * piece * Tr::qk_pitch;
      T* const v_piece = v_slot + i * piece * Tr::v_pitch;
      const int piece_key0 = key0 + i * piece;
      const int piece_valid = valid - i * piece;
      if (piece_valid > 0) {
        const attention::KVTileRows<Mode, const T> rows(c, piece_key0, min(piece_valid, piece));
        if (rows.in_page >= 0) {
          load_kv_strided<Tr, piece>(k_piece, v_piece, c, rows, piece_valid, lane);
          continue;
        }
      }
      load_kv_by_key<Tr, piece>(k_piece, v_piece, c, piece_key0, piece_valid, lane);
    }
  } else {
    load_kv_by_key<Tr, Tr::block_n>(slot, v_slot, c, key0, valid, lane);
  }
}

// Starts one warp's copy of the key and value descales (fp32) of keys [key0, key0 + block_n)
// into `to`, the keys' then the values'; past `valid`, zeros, nothing read.
template <class Tr, attention::KVMode Mode>
__device__ __forceinline__ void load_token_descales(
    float* to, const attention::KVRows<Mode, const float>& descales, int key0, int valid,
    int lane) {
#pragma unroll
  for (int i = 0; i < (Tr::block_n + 31) / 32; ++i) {
    const int row = lane + 32 * i;
    if (Tr::block_n % 32 != 0 && row >= Tr::block_n) break;
    long long k_off = 0, v_off = 0;
    const bool ok = row < valid;
    if (ok) descales.offsets(key0 + row, k_off, v_off);
    mma::cp_async_4(mma::smem_address(to + row), descales.k + k_off, ok);
    mma::cp_async_4(mma::smem_address(to + Tr::block_n + row), descales.v + v_off, ok);
  }
}

// Split-KV's hand-off (DecodeParams::split_flags), run by one warp of each split's CTA once the
// whole CTA has written its partial state: sets the split's flag to the call's tag, then reads
// every split's flag of the row block; true when all carry the tag. The flags are 0 before the
// call, and any value but the call's tag (one a failed earlier call left) counts as unset.
// The fences are sequentially consistent, so of splits finishing together at least one sees all
// flags set; several may, and each then merges the same states into the same bytes.
__device__ __forceinline__ bool publish_split(unsigned long long* flags, int split, int splits,
                                              unsigned long long tag, int lane) {
  __threadfence();  // the CTA's partial state is visible device-wide before the flag
  if (lane == 0) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;\n" ::"l"(flags + split), "l"(tag) : "memory");
  }
  __threadfence();  // the flag is, before the others are read
  bool all = true;
#pragma unroll 1
  for (int s = lane; s < splits; s += 32) {
    // Acquire: the states of the splits seen done are read after this, by the whole CTA.
    unsigned long long flag;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];\n" : "=l"(flag) : "l"(flags + s) : "memory");
    all = all && flag == tag;
  }
  return __all_sync(0xffffffffu, all);
}

// The work of one CTA: a block of packed rows of one (sequence, kv head), against its split's
// range of the keys any of those rows attends.
struct DecodeBlock {
  int batch;
  int split;
  int row_block;
  PackedRows packed;  // the kv head's rows
  int row_begin;      // the block's packed rows [row_begin, row_end)
  int row_end;
  int seqlen_k;
  attention::Band band;
  int split_begin;  // the split's keys [split_begin, split_end), whole CTA steps
  int split_end;
  int unmasked_first;  // keys every row of the block attends: tiles inside need no mask
  int unmasked_last;

  // Whether the tile of keys [key0, key0 + keys) needs the band mask.
  __device__ __forceinline__ bool needs_mask(int key0, int keys) const {
    return key0 < unmasked_first || key0 + keys - 1 > unmasked_last;
  }
};

template <class Spec, class Tr>
__device__ __forceinline__ DecodeBlock decode_block(const DecodeParams& p) {
  DecodeBlock b;
  b.split = static_cast<int>(blockIdx.x) % p.num_splits;
  b.row_block = static_cast<int>(blockIdx.x) / p.num_splits;
  b.batch = blockIdx.z;
  const int group = p.heads / p.heads_kv;
  b.packed = {static_cast<int>(blockIdx.y), group, p.seqlen_q * group};
  b.row_begin = b.row_block * Tr::rows;
  b.row_end = min(b.row_begin + Tr::rows, b.packed.count);
  b.seqlen_k = p.seqlens[b.batch] + p.seqlen_new;
  b.band = attention::make_band<Spec::band>(p.score, p.seqlen_q, b.seqlen_k);

  // The keys any row of the block attends, cut into num_splits ranges of whole CTA steps.
  constexpr int step = Tr::warps * Tr::block_n;
  const int first_query = b.packed.at(b.row_begin).query;
  const int last_query = b.packed.at(b.row_end - 1).query;
  const int lo = b.band.first_key(first_query);
  const int hi = b.band.last_key(last_query) + 1;
  const int steps = hi > lo ? (hi - lo + step - 1) / step : 0;
  const int steps_per_split = (steps + p.num_splits - 1) / p.num_splits;
  b.split_begin = lo + b.split * steps_per_split * step;
  b.split_end = min(hi, b.split_begin + steps_per_split * step);
  b.unmasked_first = b.band.first_key(last_query);
  b.unmasked_last = min(b.split_end - 1, b.band.last_key(first_query));
  return b;
}

// Stage 1, gather Q: the block's packed rows (zero past the last) into shared memory, by all
// threads, as the first cp.async group.
template <class Tr>
__device__ __forceinline__ void gather_q(typename Tr::Q* smem_q, const DecodeParams& p,
                                         const DecodeBlock& b, int thread) {
  using T = typename Tr::Q;
  // NOTE: from the kv head's first query head, so that the base is uniform across the CTA and
  // each row adds only its own offset.
  const int first_head = b.packed.first_head();
  const T* const q =
      static_cast<const T*>(p.q) + b.batch * p.q_batch_stride + first_head * p.q_head_stride;
  constexpr int chunks_per_row = Tr::qk_dim / 8;
  constexpr int chunks = Tr::rows * chunks_per_row;
#pragma unroll
  for (int i = 0; i < (chunks + Tr::threads - 1) / Tr::threads; ++i) {
    const int chunk = thread + i * Tr::threads;
    if (chunks % Tr::threads != 0 && chunk >= chunks) break;
    const int row = chunk / chunks_per_row;
    const int col = chunk % chunks_per_row * 8;
    const bool ok = b.row_begin + row < b.row_end && col < Tr::head_dim;
    const PackedRow r = b.packed.at(b.row_begin + row);
    const T* src = q + r.query * p.q_seq_stride + (r.head - first_head) * p.q_head_stride + col;
    mma::cp_async_16(
        mma::smem_address(smem_q + attention::tile_offset<Tr::qk_pitch, Tr::qk_swizzle>(row, col)),
        ok ? src : q, ok);
  }
  mma::cp_async_commit();
}

// Where each packed row of the block puts its results, and its sink: worked out while the first
// tiles load, since the end of the kernel runs with one warp per scheduler, so every
// instruction there is latency.
template <class Tr>
struct RowTargets {
  long long state[Tr::rows];  // (batch, query, head) state index
  long long out[Tr::rows];    // element offset in out
  long long lse[Tr::rows];    // element offset in lse
  float sink[Tr::rows];       // sink logit, in split 0's state only (or -inf)

  template <class Spec>
  __device__ __forceinline__ void find(const DecodeParams& p, const DecodeBlock& b, int thread) {
    const int kv_head = b.packed.kv_head;
    for (int row = thread; row < Tr::rows; row += Tr::threads) {
      const auto [query, head] = b.packed.at_or_last(b.row_begin + row);
      state[row] = (static_cast<long long>(b.batch) * p.seqlen_q + query) * p.heads + head;
      out[row] = b.batch * p.out_batch_stride + query * p.out_seq_stride + head * p.out_head_stride;
      lse[row] = b.batch * p.lse_batch_stride + head * p.lse_head_stride + query;
      sink[row] =
          b.split == 0
              ? attention::row_sink<Spec>(
                    p.score, attention::make_logit_row<Spec>(
                                 p.score, {b.batch, head, kv_head, query, -1, b.band.offset}))
              : attention::neg_inf();
    }
  }
};

// Stage 2, stream K/V: a warp's own tiles of the split's keys, split_begin + (warp + warps * t) *
// block_n, through `stages` cp.async slots, each through scores, logits and the online softmax
// into the warp's outputs. Constructing it starts the first tiles' loads.
template <class Spec, class Tr>
struct KvStream {
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  static constexpr int step = Tr::warps * Tr::block_n;

  static constexpr attention::KVMode mode = attention::cache_mode(Spec::paged);

  attention::KVRows<mode, const KV> cache;
  attention::KVRows<mode, const float> descales;  // token_descales
  KV* slots;
  int first;  // the warp's first key
  int tiles;
  int split_end;
  int lane;

  __device__ __forceinline__ KvStream(const DecodeParams& p, const DecodeBlock& b, Q* smem_q,
                                      int warp, int lane_)
      : cache(attention::kv_rows<mode, const KV>(p.kv, b.batch, b.packed.kv_head)),
        descales(attention::kv_rows<mode, const float>(p.token_descale, b.batch, b.packed.kv_head)),
        slots(reinterpret_cast<KV*>(smem_q + Tr::q_elems) + warp * Tr::warp_elems),
        first(b.split_begin + warp * Tr::block_n),
        tiles(first < b.split_end ? (b.split_end - first + step - 1) / step : 0),
        split_end(b.split_end),
        lane(lane_) {
#pragma unroll
    for (int t = 0; t < Tr::stages - 1; ++t) load(t);
  }

  __device__ __forceinline__ void load(int t) const {
    if (t < tiles) {
      const int key0 = first + t * step;
      KV* const slot = slots + (t % Tr::stages) * Tr::slot_elems;
      load_kv_tile<Tr, mode>(slot, cache, key0, split_end - key0, lane);
      if constexpr (Tr::token_descales) {
        load_token_descales<Tr>(reinterpret_cast<float*>(slot + Tr::descales_at), descales, key0,
                                split_end - key0, lane);
      }
    }
    mma::cp_async_commit();  // empty groups keep the wait count one constant
  }

  // With token_descales, tile t's key descales, then its value descales, in its slot.
  __device__ __forceinline__ const float* descales_of(int t) const {
    return reinterpret_cast<const float*>(slots + (t % Tr::stages) * Tr::slot_elems +
                                          Tr::descales_at);
  }

  // Every tile, once Q (from every thread) is in, and with an fp8 cache put into the order of
  // its K fragments: o and softmax take the warp's rows' state. With token_descales each key's
  // value descale times v_head (the kv head's) dequantizes its values.
  template <class Logits, class Softmax>
  __device__ __forceinline__ void run(float (&o)[Tr::m_tiles][Tr::o_tiles][4], Softmax& softmax,
                                      const Logits& logits, float to_log2, const DecodeBlock& b,
                                      const int (&first_key)[2 * Tr::m_tiles],
                                      const int (&last_key)[2 * Tr::m_tiles], Q* smem_q,
                                      float v_head) const {
    const attention::LaneOffsets lanes = attention::lane_offsets<Tr>(0, lane);
    const unsigned q_lane = mma::smem_address(smem_q) + lanes.q;
    const unsigned slots_base = mma::smem_address(slots);
    mma::cp_async_wait<Tr::stages - 2>();
    __syncthreads();  // Q and this warp's first tile
    if constexpr (Tr::kv_fp8) {
      attention::permute_q_for_fp8_k<Tr, Tr::rows, Tr::threads>(smem_q, threadIdx.x);
      __syncthreads();
    }
    for (int t = 0; t < tiles; ++t) {
      mma::cp_async_wait<Tr::stages - 2>();
      __syncwarp();  // tile t is visible to the warp, which is done with the slot refilled next
      load(t + Tr::stages - 1);

      const unsigned k_tile = slots_base + Tr::kv_size * (t % Tr::stages) * Tr::slot_elems;
      const unsigned v_tile = k_tile + Tr::kv_size * Tr::k_elems;
      float s[Tr::m_tiles][Tr::s_tiles][4];
      if constexpr (Tr::kv_fp8) {
        attention::qk_scores_fp8<Tr>(s, q_lane, k_tile, lanes, lane);
      } else {
        attention::qk_scores<Tr>(s, q_lane, k_tile + lanes.k, lanes);
      }
      if constexpr (Tr::token_descales) attention::scale_key_columns<Tr>(s, descales_of(t), lane);
      const int key0 = first + t * step;
      const int lane_key0 = key0 + 2 * (lane % 4);
      logits.apply(s, lane_key0, b.needs_mask(key0, Tr::block_n),
                   [&] { attention::mask_keys(s, first_key, last_key, lane_key0); });
      softmax.update(s, o, to_log2);
      if constexpr (Tr::token_descales) {
        attention::pv_accumulate_fp8<Tr, true>(o, s, v_tile, lane, descales_of(t) + Tr::block_n,
                                               v_head);
      } else if constexpr (Tr::kv_fp8) {
        attention::pv_accumulate_fp8<Tr>(o, s, v_tile, lane);
      } else {
        attention::pv_accumulate<Tr>(o, s, v_tile + lanes.v, lanes);
      }
    }
  }
};

// The fp32 regions the warps' states meet in (reusing the tiles' shared memory): per warp,
// rows x merge_pitch outputs, then every warp's row maxima (log2 units) and sums.
template <class Tr>
struct WarpStates {
  float* o;
  float* max;
  float* sum;

  __device__ __forceinline__ explicit WarpStates(unsigned char* smem)
      : o(reinterpret_cast<float*>(smem)),
        max(o + Tr::warps * Tr::rows * Tr::merge_pitch),
        sum(max + Tr::warps * Tr::rows) {}

  // Stage 3, merge warps (first half): the warp's row maxima and sums and its unscaled outputs
  // of the block's `valid_rows` rows, into its own region.
  template <class Softmax>
  __device__ __forceinline__ void leave(const float (&o_frag)[Tr::m_tiles][Tr::o_tiles][4],
                                        const Softmax& softmax, float to_log2, int valid_rows,
                                        int warp, int lane) const {
    float* const warp_o = o + warp * Tr::rows * Tr::merge_pitch;
#pragma unroll
    for (int r = 0; r < 2 * Tr::m_tiles; ++r) {
      const int row = 8 * r + lane / 4;
      const float row_sum = mma::quad_sum(softmax.row_sum[r]);
      if (lane % 4 == 0) {
        max[warp * Tr::rows + row] =
            attention::attended(row_sum) ? softmax.row_max[r] * to_log2 : attention::neg_inf();
        sum[warp * Tr::rows + row] = row_sum;
      }
      if (row < valid_rows) {
        const int mt = r / 2, x = 2 * (r % 2);
        float* const warp_row = warp_o + row * Tr::merge_pitch;
#pragma unroll
        for (int j = 0; j < Tr::o_tiles; ++j) {
          if constexpr (Tr::kv_fp8) {
            // Tiles 2G and 2G + 1 hold the even and odd head dims: together, 4 in a row from
            // 16G + 4 (lane % 4) (attention::fp8_o_column).
            if (j % 2 == 0) {
              *reinterpret_cast<float4*>(warp_row + attention::fp8_o_column(j, 0, lane)) =
                  make_float4(o_frag[mt][j][x], o_frag[mt][j + 1][x], o_frag[mt][j][x + 1],
                              o_frag[mt][j + 1][x + 1]);
            }
          } else {
            *reinterpret_cast<float2*>(warp_row + 8 * j + 2 * (lane % 4)) =
                make_float2(o_frag[mt][j][x], o_frag[mt][j][x + 1]);
          }
        }
      }
    }
  }

  // Stage 3 (second half): 4 columns of a row from `col`, every warp's part weighed by
  // exp2(its max - top) / total, with the row's sink counted in (-inf: none). Returns the
  // row's LSE (natural units).
  __device__ __forceinline__ float merge(float (&acc)[4], int row, int col, float sink) const {
    float row_max[Tr::warps];
    float top = attention::neg_inf();
#pragma unroll
    for (int w = 0; w < Tr::warps; ++w) {
      row_max[w] = max[w * Tr::rows + row];
      top = fmaxf(top, row_max[w]);
    }
    float total = 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] = 0.f;
    if (top != attention::neg_inf()) {
#pragma unroll
      for (int w = 0; w < Tr::warps; ++w) {
        const float scale = mma::exp2_approx(row_max[w] - top);
        total += scale * sum[w * Tr::rows + row];
        const float4 part =
            *reinterpret_cast<const float4*>(o + (w * Tr::rows + row) * Tr::merge_pitch + col);
        acc[0] += scale * part.x;
        acc[1] += scale * part.y;
        acc[2] += scale * part.z;
        acc[3] += scale * part.w;
      }
    }
    // total >= 1 when top is finite (the top part's own sum, or the sink's), so the
    // approximations hold.
    const float factor = attention::add_sink(sink, top, total);
    const float inv = attention::attended(total) ? factor * mma::rcp_approx(total) : 0.f;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= inv;
    return attention::attended(total) ? (top + mma::log2_approx(total)) * attention::kLn2
                                      : attention::neg_inf();
  }
};

// 4 finished columns of a row from `col`, and at column 0 its LSE, to out (and lse).
template <class Tr>
__device__ __forceinline__ void store_out(const DecodeParams& p, const RowTargets<Tr>& targets,
                                          int row, int col, const float (&acc)[4], float lse) {
  using T = typename Tr::Out;
  T* const dst = static_cast<T*>(p.out) + targets.out[row] + col;
  uint2 packed;
  packed.x = mma::pack2<T>(acc[0], acc[1]);
  packed.y = mma::pack2<T>(acc[2], acc[3]);
  *reinterpret_cast<uint2*>(dst) = packed;
  if (col == 0 && p.maybe_lse != nullptr) p.maybe_lse[targets.lse[row]] = lse;
}

// The (batch * seqlen_q * heads) states of one split in DecodeParams::partial_out and partial_lse.
__device__ __forceinline__ long long split_stride(const DecodeParams& p) {
  return static_cast<long long>(p.batch) * p.seqlen_q * p.heads;
}

// Stage 5, merge splits: every split's state of the block's rows, in split order (so the
// result does not depend on which CTA does it), into out.
template <class Tr>
__device__ __forceinline__ void merge_splits(const DecodeParams& p, const RowTargets<Tr>& targets,
                                             int valid_rows, int thread) {
  constexpr int quads = Tr::head_dim_v / 4;
  const long long stride = split_stride(p);
  for (int item = thread; item < Tr::rows * quads; item += Tr::threads) {
    const int row = item / quads;
    const int col = item % quads * 4;
    if (row >= valid_rows) break;
    // Loads of 16 states go out together, ahead of the math that waits on them.
    constexpr int batched = 16;
    const float* const out_states = p.partial_out + targets.state[row] * Tr::head_dim_v + col;
    const float* const lse_states = p.partial_lse + targets.state[row];
    const long long out_step = stride * Tr::head_dim_v;
    MergeAccumulator<1> all;
    all.init();
#pragma unroll 1
    for (int s0 = 0; s0 < p.num_splits; s0 += batched) {
      float lse[batched];
      float v[batched][1][4];
#pragma unroll
      for (int j = 0; j < batched; ++j) {
        const bool ok = s0 + j < p.num_splits;
        const float4 x =
            ok ? __ldcg(reinterpret_cast<const float4*>(out_states + (s0 + j) * out_step))
               : make_float4(0.f, 0.f, 0.f, 0.f);
        v[j][0][0] = x.x;
        v[j][0][1] = x.y;
        v[j][0][2] = x.z;
        v[j][0][3] = x.w;
        lse[j] = ok ? __ldcg(lse_states + (s0 + j) * stride) : attention::neg_inf();
      }
      all.add(lse, v);
    }
    // all.total >= 1 when any state has keys (the top state's weight is 1).
    const float inv = attention::attended(all.total) ? mma::rcp_approx(all.total) : 0.f;
    const float acc[4] = {all.acc[0][0] * inv, all.acc[0][1] * inv, all.acc[0][2] * inv,
                          all.acc[0][3] * inv};
    store_out<Tr>(p, targets, row, col, acc,
                  attention::attended(all.total)
                      ? all.top + mma::log2_approx(all.total) * attention::kLn2
                      : attention::neg_inf());
  }
}

}  // namespace decode

// The kernel, as its stages: gather Q, stream K/V (each warp its own tiles), merge the warps,
// then out, or with several splits publish this split's state and, in the split that finds
// them all done, merge the splits.
template <class Spec>
__global__ void __launch_bounds__(decode::DecodeTraits<Spec>::threads,
                                  decode::DecodeTraits<Spec>::min_blocks)
    attention_decode(const KILN_GRID_CONSTANT DecodeParams p) {
  using namespace decode;
  using Tr = DecodeTraits<Spec>;
  using Q = typename Tr::Q;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  Q* const smem_q = reinterpret_cast<Q*>(smem_bytes);

  // Launched to overlap the kernel before it (LaunchConfig::overlap_previous), which may have
  // written q or the cache: nothing global is touched before this point. The kernel after this
  // one may be scheduled from here on; it waits for this grid to finish in the same way.
  wait_for_previous_grid();
  allow_next_grid();

  const int thread = threadIdx.x;
  const int warp = thread / 32;
  const int lane = thread % 32;
  const DecodeBlock b = decode_block<Spec, Tr>(p);

  gather_q<Tr>(smem_q, p, b, thread);
  const KvStream<Spec, Tr> kv(p, b, smem_q, warp, lane);
  __shared__ RowTargets<Tr> targets;
  targets.template find<Spec>(p, b, thread);

  // The thread's packed rows row_begin + 8 r + lane / 4 (attention/core/logits.cuh), the last
  // one standing in past the block's end, and the keys of each row's band in the split.
  auto logits = attention::make_score_transform<Spec, mma::ApproxMath, 2 * Tr::m_tiles, 0>(
      p.score, p.seqlen_q, b.seqlen_k);
  int first_key[2 * Tr::m_tiles];
  int last_key[2 * Tr::m_tiles];
#pragma unroll
  for (int r = 0; r < 2 * Tr::m_tiles; ++r) {
    const auto [query, head] = b.packed.at_or_last(b.row_begin + 8 * r + lane / 4);
    logits.rows[r] = attention::make_logit_row<Spec>(
        p.score, {b.batch, head, b.packed.kv_head, query, -1, b.band.offset});
    first_key[r] = b.band.first_key(query);
    last_key[r] = min(b.split_end - 1, b.band.last_key(query));
  }
  // An fp8 cache's descales: the keys' joins the softmax scale; the values' multiplies out, or
  // with token descales each value as it is widened (KvStream::run).
  float v_descale = 1.f;
  if constexpr (Tr::kv_fp8) {
    const attention::HeadDescales d =
        attention::head_descales(p.descales, b.batch, b.packed.kv_head);
    logits.scale *= attention::descale_or_one(d.k);
    v_descale = attention::descale_or_one(d.v);
  }
  const float to_log2 = logits.to_log2();

  float o[Tr::m_tiles][Tr::o_tiles][4];
  attention::zero_fragments(o);
  attention::OnlineSoftmax<Tr::m_tiles, 64> softmax;
  softmax.init();
  kv.run(o, softmax, logits, to_log2, b, first_key, last_key, smem_q, v_descale);

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with its slots, which the merge reuses
  const int valid_rows = b.row_end - b.row_begin;
  const WarpStates<Tr> states(smem_bytes);
  states.leave(o, softmax, to_log2, valid_rows, warp, lane);
  __syncthreads();

  // Each thread finishes 4 consecutive columns of a row at a time: to out, or with several
  // splits to this split's fp32 partial state. The sink joins split 0's state only, so the
  // split merge counts it once.
  const bool split_out = p.num_splits > 1;
  constexpr int quads = Tr::head_dim_v / 4;
  for (int item = thread; item < valid_rows * quads; item += Tr::threads) {
    const int row = item / quads;
    const int col = item % quads * 4;
    float acc[4];
    const float lse = states.merge(acc, row, col, targets.sink[row]);
    if constexpr (Tr::kv_fp8 && !Tr::token_descales) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[e] *= v_descale;
    }
    if (split_out) {
      const long long state = b.split * split_stride(p) + targets.state[row];
      *reinterpret_cast<float4*>(p.partial_out + state * Tr::head_dim_v + col) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (col == 0) p.partial_lse[state] = lse;
    } else {
      store_out<Tr>(p, targets, row, col, acc, lse);
    }
  }
  if (!split_out) return;

  // Stage 4, publish the split; the one that finds every split of its row block done merges.
  unsigned long long* const flags =
      p.split_flags +
      (static_cast<long long>(b.batch) * p.heads_kv + b.packed.kv_head) * gridDim.x +
      b.row_block * p.num_splits;
  __shared__ bool merges;
  __syncthreads();  // the CTA's partial state is written
  if (warp == 0) {
    const bool all = publish_split(flags, b.split, p.num_splits, p.split_tag, lane);
    if (lane == 0) merges = all;
  }
  __syncthreads();
  if (!merges) return;
  merge_splits<Tr>(p, targets, valid_rows, thread);
  // A replayed CUDA graph keeps the tag it was captured with: leave the flags unset for it.
  for (int s = thread; s < p.num_splits; s += Tr::threads) flags[s] = 0;
}

}  // namespace kiln
