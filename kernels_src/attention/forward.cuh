// Forward attention (FlashAttention-2): one CTA per (block_m query rows, head, batch) streams
// K/V tiles through a cp.async pipeline, mma.sync on tensor cores, online softmax in fp32.
//
// Spec constants (all of them change the generated code; everything else is in Params):
//   dtype        kiln::f16 or kiln::bf16: q, k, v, out and bias; accumulation is fp32.
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
// attention_forward_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages) from
// "kiln/params/attention.h" (more than 48 KiB needs the function's max-dynamic-smem attribute).
// Do not launch an empty grid (seqlen_q == 0 or batch == 0): there is nothing to write.
//
// Config table for sm_90 (H100/H200), by max(head_dim, head_dim_v); tuned on an H200, see
// dev notes. (block_m, block_n, warps, stages):
//   <= 64:  band (128, 128, 4, 2), no band (128, 64, 4, 2)
//   <= 128: (128, 64, 4, 1)
//   <= 256: (64, 64, 4, 1)        2 CTAs per SM; (128, 64, 8, 2) fits one and runs ~5% slower
// sm_80 (163 KiB smem) takes the same table; sm_86/89 (99 KiB) need block_m 64 above 128.
#pragma once

#include "attention/logits.cuh"
#include "attention/mask.cuh"
#include "attention/sequence.cuh"
#include "attention/softmax.cuh"
#include "attention/tile_io.cuh"
#include "attention/traits.cuh"
#include "common/mma.cuh"
#include "common/prelude.cuh"
#include "kiln/params/attention.h"

namespace kiln {
namespace attention {

// s = Q K^T for the warp's rows and one K tile. q_lane and k_lane are this lane's ldmatrix row
// addresses (see lane_offsets). Step i of the (kk, np) loop loads its fragments Tr::prefetch
// steps early, into register rings.
template <class Tr>
__device__ __forceinline__ void qk_scores(float (&s)[Tr::m_tiles][Tr::s_tiles][4], unsigned q_lane,
                                          unsigned k_lane) {
  constexpr int row_bytes = Tr::qk_pitch * 2;
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < Tr::s_tiles; ++nt) {
#pragma unroll
      for (int x = 0; x < 4; ++x) s[mt][nt][x] = 0.f;
    }
  }
  constexpr int np_count = Tr::s_tiles / 2;
  constexpr int steps = Tr::qk_dim / 16 * np_count;
  constexpr int a_ring = (Tr::prefetch + np_count - 1) / np_count + 1;
  constexpr int b_ring = Tr::prefetch + 1;
  unsigned a[a_ring][Tr::m_tiles][4];
  unsigned b[b_ring][4];
  auto load = [&](int i) {
    const int kk = i / np_count, np = i % np_count;
    if (np == 0) {
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::ldmatrix_x4(a[kk % a_ring][mt], q_lane + mt * 16 * row_bytes + kk * 32);
      }
    }
    mma::ldmatrix_x4(b[i % b_ring], k_lane + np * 16 * row_bytes + kk * 32);
  };
#pragma unroll
  for (int i = 0; i < Tr::prefetch; ++i) load(i);
    // NOTE: nested loops rather than one over i: at head_dim 256 the flat loop was left partly
    // rolled, and the rings went to local memory.
#pragma unroll
  for (int kk = 0; kk < Tr::qk_dim / 16; ++kk) {
#pragma unroll
    for (int np = 0; np < np_count; ++np) {
      const int i = kk * np_count + np;
      if (i + Tr::prefetch < steps) load(i + Tr::prefetch);
      const unsigned(&b_i)[4] = b[i % b_ring];
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::mma_16816<typename Tr::T>(s[mt][2 * np], a[kk % a_ring][mt], b_i[0], b_i[1]);
        mma::mma_16816<typename Tr::T>(s[mt][2 * np + 1], a[kk % a_ring][mt], b_i[2], b_i[3]);
      }
    }
  }
}

// o += P V, with P the probabilities left in s. An m16n8 accumulator pair (n8 tiles 2kk, 2kk+1)
// is exactly the A fragment of a k16 step, so P goes from registers to the mma unshuffled.
// V fragments are loaded Tr::prefetch (kk, dp) steps early, as in qk_scores.
template <class Tr>
__device__ __forceinline__ void pv_accumulate(float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                              const float (&s)[Tr::m_tiles][Tr::s_tiles][4],
                                              unsigned v_lane) {
  using T = typename Tr::T;
  constexpr int row_bytes = Tr::v_pitch * 2;
  constexpr int dp_count = Tr::o_tiles / 2;
  constexpr int steps = Tr::block_n / 16 * dp_count;
  constexpr int b_ring = Tr::prefetch + 1;
  unsigned b[b_ring][4];
  auto load = [&](int i) {
    const int kk = i / dp_count, dp = i % dp_count;
    mma::ldmatrix_x4_trans(b[i % b_ring], v_lane + kk * 16 * row_bytes + dp * 32);
  };
#pragma unroll
  for (int i = 0; i < Tr::prefetch; ++i) load(i);
#pragma unroll
  for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
    unsigned a[Tr::m_tiles][4];
#pragma unroll
    for (int mt = 0; mt < Tr::m_tiles; ++mt) {
      a[mt][0] = mma::pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
      a[mt][1] = mma::pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
      a[mt][2] = mma::pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
      a[mt][3] = mma::pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < dp_count; ++dp) {
      const int i = kk * dp_count + dp;
      if (i + Tr::prefetch < steps) load(i + Tr::prefetch);
      const unsigned(&b_i)[4] = b[i % b_ring];
#pragma unroll
      for (int mt = 0; mt < Tr::m_tiles; ++mt) {
        mma::mma_16816<T>(o[mt][2 * dp], a[mt], b_i[0], b_i[1]);
        mma::mma_16816<T>(o[mt][2 * dp + 1], a[mt], b_i[2], b_i[3]);
      }
    }
  }
}

// Shared-memory byte addresses each lane hands ldmatrix, relative to its tile's start:
// Q (A operand, row-major m16k16): rows lane % 16, columns 8 * (lane / 16).
// K (B operand, keys as n): keys lane % 8 + 8 * (lane / 16), columns 8 * (lane / 8 % 2).
// V (B operand through .trans, keys as k): keys lane % 16, columns 8 * (lane / 16).
struct LaneOffsets {
  unsigned q;
  unsigned k;
  unsigned v;
};

template <class Tr>
__device__ __forceinline__ LaneOffsets lane_offsets(int warp, int lane) {
  LaneOffsets off;
  off.q = 2 * ((warp * Tr::rows_per_warp + lane % 16) * Tr::qk_pitch + 8 * (lane / 16));
  off.k = 2 * ((lane % 8 + 8 * (lane / 16)) * Tr::qk_pitch + 8 * (lane / 8 % 2));
  off.v = 2 * ((lane % 16) * Tr::v_pitch + 8 * (lane / 16));
  return off;
}

// The output tile through shared memory (reusing it from offset 0), so that global stores are
// whole 16-byte row pieces.
template <class Tr>
__device__ __forceinline__ void stage_output(typename Tr::T* smem,
                                             const float (&o)[Tr::m_tiles][Tr::o_tiles][4],
                                             int warp, int lane) {
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = warp * Tr::rows_per_warp + mt * 16 + half * 8 + lane / 4;
#pragma unroll
      for (int j = 0; j < Tr::o_tiles; ++j) {
        const int col = j * 8 + 2 * (lane % 4);
        *reinterpret_cast<unsigned*>(smem + row * Tr::v_pitch + col) =
            mma::pack2<typename Tr::T>(o[mt][j][2 * half], o[mt][j][2 * half + 1]);
      }
    }
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

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::ForwardTraits<Spec>::threads)
    attention_forward(const KILN_GRID_CONSTANT AttentionParams p) {
  using namespace attention;
  using Tr = ForwardTraits<Spec>;
  using T = typename Tr::T;

  extern __shared__ __align__(128) unsigned char smem_bytes[];
  T* const smem = reinterpret_cast<T*>(smem_bytes);
  T* const smem_kv = smem + Tr::q_elems;

  // Row blocks run last-first: under a causal band the late ones have the most keys, and
  // starting them first keeps the tail of the grid short.
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const Sequence seq = locate_sequence<Spec::varlen>(p, blockIdx.z, blockIdx.y);
  const int row_begin = m_block * Tr::block_m;
  if (row_begin >= seq.seqlen_q) return;
  const int row_end = min(row_begin + Tr::block_m, seq.seqlen_q);

  const int thread = threadIdx.x;
  const int warp = thread / 32;
  const int lane = thread % 32;

  const Band band = make_band<Spec::band>(p, seq);
  const KeyBlocks blocks = key_blocks(band, row_begin, row_end, Tr::block_n);
  const LogitTransform<Spec> transform = make_logit_transform<Spec>(p, seq, band);
  const float to_log2 = transform.to_log2();

  // This thread's first row within the sequence; its others are 8, 16, ... further.
  const int row0 = row_begin + warp * Tr::rows_per_warp + lane / 4;

  const T* const q = static_cast<const T*>(p.q) + seq.q_offset + row_begin * p.q_seq_stride;
  const T* const k = static_cast<const T*>(p.k) + seq.k_offset;
  const T* const v = static_cast<const T*>(p.v) + seq.v_offset;
  auto load_k = [&](int block, int slot) {
    const int key0 = block * Tr::block_n;
    load_tile_async<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
        smem_kv + slot * Tr::slot_elems, k + key0 * p.k_seq_stride, p.k_seq_stride,
        seq.seqlen_k - key0, thread);
  };
  auto load_v = [&](int block, int slot) {
    const int key0 = block * Tr::block_n;
    load_tile_async<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::v_pitch, Tr::threads>(
        smem_kv + slot * Tr::slot_elems + Tr::k_elems, v + key0 * p.v_seq_stride, p.v_seq_stride,
        seq.seqlen_k - key0, thread);
  };

  // Prologue. Q joins the first group. With one stage K and V alternate (FlashAttention-2):
  // V of a block loads during its QK^T, K of the next during its softmax and PV. With more,
  // K and V of a block travel together and stages - 1 groups, empty or not, stay in flight,
  // so that the loop's wait count is one constant.
  load_tile_async<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::qk_pitch, Tr::threads>(
      smem, q, p.q_seq_stride, row_end - row_begin, thread);
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

  const LaneOffsets lanes = lane_offsets<Tr>(warp, lane);
  const unsigned q_lane = mma::smem_address(smem) + lanes.q;
  const unsigned kv_base = mma::smem_address(smem_kv);

  float o[Tr::m_tiles][Tr::o_tiles][4];
#pragma unroll
  for (int mt = 0; mt < Tr::m_tiles; ++mt) {
#pragma unroll
    for (int j = 0; j < Tr::o_tiles; ++j) {
#pragma unroll
      for (int x = 0; x < 4; ++x) o[mt][j][x] = 0.f;
    }
  }
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

    const unsigned k_tile = kv_base + 2 * read_slot * Tr::slot_elems;
    const unsigned v_tile = k_tile + 2 * Tr::k_elems;
    float s[Tr::m_tiles][Tr::s_tiles][4];
    qk_scores<Tr>(s, q_lane, k_tile + lanes.k);

    const int key0 = block * Tr::block_n + 2 * (lane % 4);
    transform.apply(s, row0, key0);
    if (blocks.needs_mask(block, Tr::block_n)) mask_logits(s, band, row0, key0);
    if constexpr (Tr::stages == 1) {
      mma::cp_async_wait<0>();
      __syncthreads();  // V is visible to all, and every warp is done reading K
      if (block + 1 < blocks.end) load_k(block + 1, 0);
      mma::cp_async_commit();
    }
    softmax.update(s, o, to_log2);
    pv_accumulate<Tr>(o, s, v_tile + lanes.v);

    if constexpr (Tr::stages > 1) read_slot = read_slot == Tr::stages - 1 ? 0 : read_slot + 1;
  }

  float lse[2 * Tr::m_tiles];
  softmax.finish(o, to_log2, lse);

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done reading K/V before the output overwrites them
  stage_output<Tr>(smem, o, warp, lane);
  __syncthreads();
  T* const out = static_cast<T*>(p.out) + seq.out_offset + row_begin * p.out_seq_stride;
  store_tile<Tr::block_m, Tr::head_dim_v, Tr::v_pitch, Tr::threads>(out, p.out_seq_stride, smem,
                                                                    row_end - row_begin, thread);
  if (p.maybe_lse != nullptr)
    store_lse<Tr>(p.maybe_lse + seq.lse_offset, lse, row0, seq.seqlen_q, lane);
}

}  // namespace kiln
