// SPDX-License-Identifier: Apache-2.0
// Forward attention without tensor cores or inline assembly, for AMD targets and as a
// cross-check of the AMD path on NVIDIA: one CTA per (block_m query rows, head, batch) stages
// K/V tiles in shared memory with plain 16-byte loads; a group of neighbouring lanes owns each
// query row, with online softmax in fp32.
//
// Spec constants (as in attention/prefill/forward.cuh, less stages):
//   dtype, head_dim, head_dim_v, band, varlen, has_softcap, has_alibi, has_bias   as there.
//   block_m   query rows per CTA.
//   block_n   keys per shared-memory tile, a multiple of 16 from 16 to 128.
//   warps     the CTA has warps * 32 threads on every vendor (an AMD wavefront of 64 lanes is
//             two of them, so warps is even there); warps * 32 / block_m lanes share a row.
//
// The lanes of a row's group split its head dims in 8-element chunks: lane l of the group holds
// chunks l, l + row_lanes, ... of q (as fp32) and of the output accumulators. A score is the
// sum of the group's partial dot products, added up by xor shuffles, which leaves every score
// of the row in every lane of its group: the softmax then needs no exchange at all.
//
// Launch: grid (ceil(seqlen_q / block_m), heads, batch), where seqlen_q is the longest sequence
// for varlen; block warps * 32 threads; dynamic shared memory
// attention_forward_portable_smem_bytes(head_dim, head_dim_v, block_n, kv_size) from
// "kiln/params/attention.h". Do not launch an empty grid (seqlen_q == 0 or batch == 0).
#pragma once

#include "attention/core/kv_layout.cuh"
#include "attention/core/lane_chunks.cuh"
#include "attention/core/logits.cuh"
#include "attention/core/mask.cuh"
#include "attention/core/math.cuh"
#include "attention/core/tile_copy.cuh"
#include "attention/core/traits.cuh"
#include "attention/prefill/logits.cuh"
#include "attention/prefill/sequence.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention.h"

namespace kiln {
namespace attention {

template <class Spec>
struct PortableTraits : HeadTraits<Spec> {
  using Head = HeadTraits<Spec>;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int threads = static_cast<int>(Spec::warps) * 32;
  static constexpr int row_lanes = block_m >= 1 ? threads / block_m : 0;

  static_assert(threads >= KILN_WARP_SIZE && threads <= 1024 && threads % KILN_WARP_SIZE == 0,
                "warps * 32 must be a multiple of the warp size (64 on AMD, so an even number "
                "of warps there) and at most 1024.");
  static_assert(block_m >= 1 && block_m * row_lanes == threads && row_lanes <= 32 &&
                    (row_lanes & (row_lanes - 1)) == 0,
                "warps * 32 / block_m, the lanes that share a query row, must be 1, 2, 4, 8, 16 "
                "or 32.");
  static_assert(block_n % 16 == 0 && block_n >= 16 && block_n <= 128,
                "block_n must be a multiple of 16 from 16 to 128.");

  // 8-element (16-byte) chunks of a q/k row and of a v/out row, and how many of each a lane
  // holds; the last round may leave some lanes of the group without one.
  static constexpr int qk_chunks = Head::head_dim / 8;
  static constexpr int v_chunks = Head::head_dim_v / 8;
  static constexpr int qk_per_lane = lane_chunks(qk_chunks, row_lanes);
  static constexpr int v_per_lane = lane_chunks(v_chunks, row_lanes);

  // Shared memory, in bytes: the K tile, then the V tile.
  static constexpr int k_bytes = block_n * Head::head_dim * Head::kv_size;
  static constexpr long long smem_bytes = attention_forward_portable_smem_bytes(
      Head::head_dim, Head::head_dim_v, block_n, Head::kv_size);
  static_assert(smem_bytes == k_bytes + block_n * Head::head_dim_v * Head::kv_size,
                "attention_forward_portable_smem_bytes disagrees with the kernel's layout.");
  static_assert(smem_bytes <= 64 * 1024,
                "the K and V tiles need more than 64 KiB of shared memory, an AMD workgroup's "
                "limit: lower block_n.");
};

// Online softmax of one query row whose every logit the thread holds: running max and sum in
// fp32, rescaling the output accumulators when the max grows, normalizing once at the end.
template <class Math, int Chunks>
struct RowSoftmax {
  float row_max;  // of the logits seen so far
  float row_sum;  // of exp2(logit * to_log2 - shift), at the current max

  __device__ __forceinline__ void init() {
    row_max = neg_inf();
    row_sum = 0.f;
  }

  // Turns logits s into unnormalized probabilities and rescales o to the new max.
  template <int Keys>
  __device__ __forceinline__ void update(float (&s)[Keys], float (&o)[Chunks][8], float to_log2) {
    float m = row_max;
#pragma unroll
    for (int j = 0; j < Keys; ++j) m = fmaxf(m, s[j]);
    const float shift = softmax_shift(m, to_log2);
    const float rescale = softmax_rescale<Math>(row_max, m, shift, to_log2);
    row_max = m;
    float sum = row_sum * rescale;
#pragma unroll
    for (int j = 0; j < Keys; ++j) {
      s[j] = Math::exp2(fmaf(s[j], to_log2, -shift));
      sum += s[j];
    }
    row_sum = sum;
    scale(o, rescale);
  }

  // Normalizes o by the row sum and returns the row's natural-log sum of exp of its logits
  // (-inf, with o = 0, for a row that attended no key), a sink logit (natural units; -inf: none)
  // counted in (add_sink).
  __device__ __forceinline__ float finish(float (&o)[Chunks][8], float to_log2, float sink) const {
    float sum = row_sum;
    float shift = softmax_shift(row_max, to_log2);
    const float factor = add_sink(sink, shift, sum);
    scale(o, (attended(sum) ? 1.f / sum : 0.f) * factor);
    return row_lse(shift, sum);
  }

  static __device__ __forceinline__ void scale(float (&o)[Chunks][8], float factor) {
#pragma unroll
    for (int i = 0; i < Chunks; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) o[i][e] *= factor;
    }
  }
};

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::PortableTraits<Spec>::threads)
    attention_forward_portable(const KILN_GRID_CONSTANT AttentionParams p) {
  using namespace attention;
  using Tr = PortableTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  using Out = typename Tr::Out;
  using Math = LibraryMath;

  extern __shared__ uint4 smem_chunks[];
  KV* const k_tile = reinterpret_cast<KV*>(smem_chunks);
  KV* const v_tile =
      reinterpret_cast<KV*>(reinterpret_cast<unsigned char*>(smem_chunks) + Tr::k_bytes);

  const Tile tile = cta_tile<Spec, Tr::block_m, Tr::block_n>(p);
  const Sequence& seq = tile.seq;
  const RowBlock& rows = tile.rows;
  const Band& band = tile.band;
  const KeyBlocks& blocks = tile.blocks;
  if (rows.begin >= rows.end) return;

  const int thread = threadIdx.x;
  const int lane = thread % Tr::row_lanes;  // within the row's group
  // This thread's row within the sequence. Rows past rows.end compute along (every lane of a
  // warp takes part in the shuffles) but neither read q nor write anything.
  const int row = rows.begin + thread / Tr::row_lanes;
  const bool row_valid = row < rows.end;

  const auto transform = make_logit_transform<Spec, Math, 1>(p, seq, band, row);
  const float to_log2 = transform.to_log2();

  float q[Tr::qk_per_lane][8];
  fill(q, 0.f);
  if (row_valid) {
    const Q* const q_row = static_cast<const Q*>(p.q) + seq.q_offset + row * p.q_seq_stride;
    for_lane_chunks<Tr::qk_chunks, Tr::row_lanes>(
        lane, [&](int i, int col) { load_chunk(q[i], q_row + col); });
  }

  float o[Tr::v_per_lane][8];
  fill(o, 0.f);
  RowSoftmax<Math, Tr::v_per_lane> softmax;
  softmax.init();

  const auto kv = sequence_kv<Spec, KV>(p, seq);
  for (int block = blocks.begin; block < blocks.end; ++block) {
    const int key0 = block * Tr::block_n;
    __syncthreads();  // every lane is done with the previous tiles
    load_tile<Tr::block_n, Tr::head_dim, Tr::head_dim, Tr::threads>(
        k_tile, kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, seq.seqlen_k - key0, thread);
    load_tile<Tr::block_n, Tr::head_dim_v, Tr::head_dim_v, Tr::threads>(
        v_tile, kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride, seq.seqlen_k - key0, thread);
    __syncthreads();

    float s[Tr::block_n];
    tile_dots<Tr::block_n, Tr::head_dim, Tr::row_lanes>(s, q, k_tile, lane);
    transform.apply(s, key0, blocks.needs_mask(block, Tr::block_n),
                    [&] { mask_row(s, band, row, key0); });
    softmax.update(s, o, to_log2);
    tile_accumulate<Tr::block_n, Tr::head_dim_v, Tr::row_lanes>(o, s, v_tile, lane);
  }

  float sink[1];
  transform.sinks(sink, p.score);
  const float lse = softmax.finish(o, to_log2, sink[0]);
  if (!row_valid) return;
  Out* const out_row = static_cast<Out*>(p.out) + seq.out_offset + row * p.out_seq_stride;
  for_lane_chunks<Tr::v_chunks, Tr::row_lanes>(
      lane, [&](int i, int col) { store_chunk(out_row + col, o[i]); });
  if (p.maybe_lse != nullptr && lane == 0) p.maybe_lse[seq.lse_offset + row] = lse;
}

}  // namespace kiln
