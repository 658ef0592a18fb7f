// SPDX-License-Identifier: Apache-2.0
// Forward attention on Hopper's warpgroup MMA (sm_90a): FlashAttention-2's algorithm with
// S = Q K^T and O += P V as wgmma.mma_async. Each warpgroup (4 warps) owns 64 query rows; the
// CTA's warpgroups share K/V tiles streamed through a cp.async pipeline into 128-byte-swizzled
// shared memory, which wgmma reads through descriptors (no ldmatrix). P stays in registers as
// the A operand of the PV product. Scores, masks, logit transforms and the online softmax are
// the mma.sync kernel's, on the same fragment layout.
//
// Spec constants: those of attention_forward (forward.cuh) without warps, which is
// block_m / 16:
//   block_m      64, 128 or 192: one warpgroup per 64 query rows.
//   block_n      keys per pipeline step, 64, 128, 192 or 256 (the tma kernel also takes 176).
//   stages       K/V tile slots in shared memory, 2 to 4 (stages - 1 steps in flight).
// head_dim and head_dim_v are padded with zeros to multiples of 64 in shared memory (the swizzle
// width); config choice keeps the waste small.
//
// Launch: grid as attention_forward; block block_m * 2 threads; dynamic shared memory
// attention_forward_wgmma_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size,
// kv_size, out_size) from
// "kiln/params/attention.h" (always above 48 KiB: the max-dynamic-smem attribute is needed).
#pragma once

#include "attention/prefill/forward.cuh"
#include "common/wgmma.cuh"

namespace kiln {
namespace attention {

// ReadsFp8: the tma kernel's, which widens fp8 k and v into slots of q's type (V alone where q is
// split, below), and takes an all-fp8 q, k and v (HeadTraits' TakesFp8Q), whose products are fp8
// ones.
template <class Spec, bool ReadsFp8 = false>
struct WgmmaTraits : HeadTraits<Spec, ReadsFp8, ReadsFp8> {
  using Head = HeadTraits<Spec, ReadsFp8, ReadsFp8>;
  using Head::head_dim;
  using Head::head_dim_v;
  using Head::out_size;
  using Head::q_fp8;
  using Head::q_size;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int stages = static_cast<int>(Spec::stages);
  static_assert(block_m == 64 || block_m == 128 || block_m == 192,
                "block_m must be 64, 128 or 192: one warpgroup per 64 query rows.");
  static_assert(block_n == 64 || block_n == 128 || block_n == 176 || block_n == 192 ||
                    block_n == 256,
                "block_n must be 64, 128, 176, 192 or 256 (a wgmma N).");
  static_assert(stages >= 2 && stages <= 4, "stages must be 2, 3 or 4.");

  static constexpr int warps = block_m / 16;
  static constexpr int threads = warps * 32;
  // A bf16 q over e4m3 k and v on the tma kernel (ReadsFp8) is split: Q K^T takes fp8 products,
  // K landing in its slots as e4m3 and q, once landed, becoming two e4m3 terms
  // (tma/q_terms.cuh); P V stays in q's type. QK: Q K^T's operand type in shared memory.
  static constexpr int qk_size = ReadsFp8 ? static_cast<int>(attention_forward_tma_qk_size(
                                                q_size, is_same<typename Head::Q, bf16>::value,
                                                is_same<typename Head::KV, e4m3>::value))
                                          : q_size;
  static constexpr bool splits_q = qk_size < q_size;
  using QK = typename conditional<splits_q, e4m3, typename Head::Q>::type;
  // Columns of QK in a chunk of the swizzle: 64 in 128 bytes, or 128 of fp8 (64 in 64 bytes at
  // fp8 head dims to 64, which a 128-byte chunk would half pad). K rows are padded to whole chunks,
  // and Q's as it lands (q_dim; split, 64-column chunks of q's type); V's columns (wgmma's N)
  // to 64 (with fp8 q above 128, to 128: its P V goes 128 columns at a time, tma/traits.cuh's
  // split_pv), and an fp8 V, transposed in shared memory (tma/converter.cuh), to whole 128-key
  // chunks.
  static constexpr int chunk_bytes = attention_forward_wgmma_chunk_bytes(head_dim, qk_size);
  static constexpr int chunk_columns = chunk_bytes / qk_size;
  static constexpr int qk_dim = round_up(head_dim, chunk_columns);
  static constexpr int q_chunk_bytes = splits_q ? 128 : chunk_bytes;
  static constexpr int q_chunk_columns = q_chunk_bytes / q_size;
  static constexpr int q_dim = round_up(head_dim, q_chunk_columns);
  static constexpr int v_dim = round_up(head_dim_v, q_fp8&& head_dim_v > 128 ? 128 : 64);
  static_assert(!q_fp8 || block_n % 128 == 0,
                "with fp8 q, k and v block_n must be 128 or 256: whole 128-key chunks of V.");

  // The fragment shapes the shared softmax, logit and output code expects (forward.cuh).
  static constexpr int rows_per_warp = 16;
  static constexpr int m_tiles = 1;
  static constexpr int s_tiles = block_n / 8;
  static constexpr int o_tiles = v_dim / 8;
  // fp8 products: the columns of V one P V product takes (at most 128, whose accumulator is
  // added into o's), its n8 tiles, and how many such products a block takes (past 128 columns,
  // one after another: tma/traits.cuh's split_pv).
  static constexpr int pv_columns = v_dim < 128 ? v_dim : 128;
  static constexpr int pv_tiles = pv_columns / 8;
  static constexpr int pv_parts = v_dim / pv_columns;
  static constexpr int v_pitch = v_dim + 8;  // the output staging tile
  // The output accumulators' columns are in order (as stage_output reads them): wgmma reads V in
  // q's type (and K in QK's), whatever type they arrive in.
  static constexpr bool fp8_o_columns = false;

  // Shared memory in bytes from the 1024-aligned base: Q, then `stages` (K, V) slots, in q's type
  // (K in QK's). Split, Q's tile holds q's two terms once made, in its bytes.
  static constexpr int q_bytes = block_m * q_dim * q_size;
  static constexpr int k_bytes = block_n * qk_dim * qk_size;
  static constexpr int slot_bytes = k_bytes + block_n * v_dim * q_size;
  static constexpr int smem_bytes = static_cast<int>(attention_forward_wgmma_smem_bytes(
      head_dim, head_dim_v, block_m, block_n, stages, q_size, q_size, out_size));
  static_assert(smem_bytes >= 1024 + q_bytes + stages * slot_bytes &&
                    smem_bytes >= 1024 + block_m * v_pitch * out_size,
                "attention_forward_wgmma_smem_bytes disagrees with the kernel's layout.");
  static_assert(splits_q || smem_bytes <= 227 * 1024,  // a split q's: tma/traits.cuh's
                "the tiles need more than 227 KiB of shared memory: lower block_m, block_n or "
                "stages.");
};

// copy_tile_async (core/tile_io.cuh) into the swizzled layout of common/wgmma.cuh at shared
// address `tile`.
template <int Rows, int Dim, int PaddedDim, int Threads, class T>
__device__ __forceinline__ void load_tile_swizzled(unsigned tile, const T* gmem,
                                                   long long row_stride, int valid_rows,
                                                   int thread) {
  copy_tile_async<Rows, Dim, PaddedDim, Threads>(
      gmem, row_stride, valid_rows, thread,
      [&](int, int r, int col) { return tile + wgmma::swizzled_offset(Rows, r, col / 8); });
}

// The A fragment of PV's k16 step kk: probabilities of keys 16 kk .. 16 kk + 15, rounded to T
// (the V slots' type, q's).
template <class T, int STiles>
__device__ __forceinline__ void probability_fragment(unsigned (&a)[4],
                                                     const float (&s)[1][STiles][4], int kk) {
  a[0] = mma::pack2<T>(s[0][2 * kk][0], s[0][2 * kk][1]);
  a[1] = mma::pack2<T>(s[0][2 * kk][2], s[0][2 * kk][3]);
  a[2] = mma::pack2<T>(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
  a[3] = mma::pack2<T>(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
}

// A warpgroup accumulator held as n8 tiles, as the flat array one wide wgmma writes.
template <int Tiles>
__device__ __forceinline__ float (&all_columns(float (&acc)[1][Tiles][4]))[4 * Tiles] {
  return *reinterpret_cast<float(*)[4 * Tiles]>(&acc[0][0][0]);
}

// Issues acc = A B^T as one committed wgmma group, with A (64 rows, at a_rows in a tile of ARows
// rows) and B (N rows, at b_rows in a tile of BRows rows) both K-major over Dim (padded)
// columns: k steps (16 columns, 32 of fp8) walk 32 bytes within a chunk of ChunkBytes (the
// swizzle's width, 128 or 64), then to the next chunk. With Terms 2 (fp8), A holds two terms of
// each 64 columns, hi's then lo's in a 128-byte chunk of their own: acc = (hi + lo) B^T, lo's
// steps first. (wgmma's fp8 products keep about 13 bits of the sum as each step adds in: the
// small terms go in while it is small, and only hi's steps lose bits at its full size. In the
// other order an LSE came 2^-10 off, bench/RESULTS.md run 67e.) acc is being written until the
// group is waited for.
template <class T, int Dim, int ARows, int N, int BRows = N, int ChunkBytes = 128, int Terms = 1>
__device__ __forceinline__ void start_kmajor_product(float (&acc)[N / 2], unsigned a_rows,
                                                     unsigned b_rows) {
  static_assert(Terms == 1 || (Terms == 2 && sizeof(T) == 1 && Dim % 64 == 0),
                "two terms of 64 fp8 columns a chunk.");
  constexpr int steps = ChunkBytes / 32;  // k steps a chunk
  constexpr int b_steps = Dim * static_cast<int>(sizeof(T)) / 32;
  constexpr int a_chunk = Terms > 1 ? 128 : ChunkBytes;
  constexpr unsigned long long swizzle = ChunkBytes == 128 ? 1 : 2;
  wgmma::fence();
  const unsigned long long a = wgmma::descriptor(a_rows, 0, 8 * a_chunk, a_chunk == 128 ? 1 : 2);
  const unsigned long long b = wgmma::descriptor(b_rows, 0, 8 * ChunkBytes, swizzle);
#pragma unroll
  for (int kk = 0; kk < Terms * b_steps; ++kk) {
    const int kb = kk % b_steps;  // B's step
    // A's: within B's chunk of 64 (Terms 2) or ChunkBytes columns, lo's 64 bytes past hi's.
    const int a_step = Terms > 1 ? kb / 2 * 4 + (kk < b_steps ? 2 : 0) + kb % 2 : kk;
    wgmma::mma_ss<T, false, N>(
        acc,
        wgmma::advance(
            a, (a_step / (a_chunk / 32)) * ARows * a_chunk + (a_step % (a_chunk / 32)) * 32),
        wgmma::advance(b, (kb / steps) * BRows * ChunkBytes + (kb % steps) * 32), kk > 0);
  }
  wgmma::commit();
}

// Issues acc += A B as one committed group, with A in registers (a, one A fragment per 16 of the
// K reduction rows) and B the N-major tile at b_tile (K rows of N columns, the N dim
// contiguous), so that k16 steps are 16 rows, 2048 bytes. acc and a are in use until the group
// is waited for.
template <class T, int K, int N>
__device__ __forceinline__ void start_nmajor_product(float (&acc)[N / 2],
                                                     const unsigned (&a)[K / 16][4],
                                                     unsigned b_tile) {
  wgmma::fence();
  const unsigned long long b = wgmma::descriptor(b_tile, K * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    wgmma::mma_rs<T, true, N>(acc, a[kk], wgmma::advance(b, kk * 16 * 128), true);
  }
  wgmma::commit();
}

// As start_nmajor_product with A from shared memory: the K-major tile at a_tile (64 rows of K
// columns, one 128-byte chunk).
template <class T, int K, int N>
__device__ __forceinline__ void start_nmajor_product(float (&acc)[N / 2], unsigned a_tile,
                                                     unsigned b_tile) {
  static_assert(K <= 64, "A's rows are one 128-byte chunk.");
  wgmma::fence();
  const unsigned long long a = wgmma::descriptor(a_tile, 0, 1024);
  const unsigned long long b = wgmma::descriptor(b_tile, K * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    wgmma::mma_ss<T, true, N>(acc, wgmma::advance(a, kk * 32), wgmma::advance(b, kk * 16 * 128),
                              true);
  }
  wgmma::commit();
}

// Issues acc = A B^T as one committed group (accumulate false: acc is overwritten), with A in
// registers (a, one A fragment per k32 step of the K reduction columns) and B the fp8 K-major
// tile at b_rows: N rows (of a tile of BRows) of K columns in 128-column chunks. acc and a are in
// use until the group is waited for.
template <class T, int K, int N, int BRows = N>
__device__ __forceinline__ void start_kmajor_product(float (&acc)[N / 2],
                                                     const unsigned (&a)[K / 32][4],
                                                     unsigned b_rows, bool accumulate) {
  static_assert(wgmma::fp8_operand<T>, "A in registers over K-major B: fp8 operands.");
  wgmma::fence();
  const unsigned long long b = wgmma::descriptor(b_rows, 0, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 32; ++kk) {
    wgmma::mma_rs<T, false, N>(acc, a[kk],
                               wgmma::advance(b, (kk / 4) * BRows * 128 + (kk % 4) * 32),
                               accumulate || kk > 0);
  }
  wgmma::commit();
}

// Issues S = Q K^T for one warpgroup's 64 rows of Q (at q_rows in the Q tile; split, of q's two
// terms) and the K tile at k_tile.
template <class Tr>
__device__ __forceinline__ void start_scores(float (&s)[1][Tr::s_tiles][4], unsigned q_rows,
                                             unsigned k_tile) {
  start_kmajor_product<typename Tr::QK, Tr::splits_q ? Tr::q_dim : Tr::qk_dim, Tr::block_m,
                       Tr::block_n, Tr::block_n, Tr::chunk_bytes, Tr::splits_q ? 2 : 1>(
      all_columns(s), q_rows, k_tile);
}

// The A fragments of PV: one per k step, 16 keys (32 of fp8).
template <class Tr>
using ProbabilityFragments = unsigned[Tr::block_n / (Tr::q_fp8 ? 32 : 16)][4];

// Issues O += P V with P in registers (a) and the V tile at v_tile: V is N-major (head dim
// contiguous); with fp8 q, k and v, K-major (keys contiguous, transposed by the tma kernel) and
// O = P V, which the caller adds into its fp32 accumulators.
template <class Tr>
__device__ __forceinline__ void start_output(float (&o)[1][Tr::o_tiles][4],
                                             const ProbabilityFragments<Tr>& a, unsigned v_tile) {
  if constexpr (Tr::q_fp8) {
    start_kmajor_product<typename Tr::Q, Tr::block_n, Tr::v_dim>(all_columns(o), a, v_tile, false);
  } else {
    start_nmajor_product<typename Tr::Q, Tr::block_n, Tr::v_dim>(all_columns(o), a, v_tile);
  }
}

// With fp8 q, k and v (split_pv): issues the block's P V for V's columns pv_columns part ..
// pv_columns (part + 1) - 1 into the first pv_columns / 2 of the scores' registers s, free once
// P is made, which the caller adds into o's (add_columns). (An accumulator of its own ran 4-5%
// slower at head dim 64 and no faster above: bench/RESULTS.md, run 66g.)
template <class Tr>
__device__ __forceinline__ void start_output_columns(float (&s)[1][Tr::s_tiles][4],
                                                     const ProbabilityFragments<Tr>& a,
                                                     unsigned v_tile, int part) {
  static_assert(Tr::q_fp8 && Tr::s_tiles >= Tr::pv_tiles,
                "P V a part of V's columns at a time in the scores' registers: fp8 products.");
  start_kmajor_product<typename Tr::Q, Tr::block_n, Tr::pv_columns, Tr::v_dim>(
      *reinterpret_cast<float(*)[Tr::pv_columns / 2]>(&s[0][0][0]), a,
      v_tile + static_cast<unsigned>(part * Tr::pv_columns) * 128, false);
}

// o's columns of part `part` += those start_output_columns put in the scores' registers s, once
// its product is in.
template <class Tr>
__device__ __forceinline__ void add_columns(float (&o)[1][Tr::o_tiles][4],
                                            const float (&s)[1][Tr::s_tiles][4], int part) {
#pragma unroll
  for (int j = 0; j < Tr::pv_tiles; ++j) {
#pragma unroll
    for (int x = 0; x < 4; ++x) o[0][part * Tr::pv_tiles + j][x] += s[0][j][x];
  }
}

// With fp8 q, k and v: o = (o + pv) * rescale, each row's, once a block's P V (pv) is in: the
// promotion of fp8 products into fp32 accumulators.
template <int Tiles>
__device__ __forceinline__ void add_output(float (&o)[1][Tiles][4], const float (&pv)[1][Tiles][4],
                                           const float (&rescale)[2]) {
#pragma unroll
  for (int j = 0; j < Tiles; ++j) {
#pragma unroll
    for (int x = 0; x < 4; ++x) o[0][j][x] = (o[0][j][x] + pv[0][j][x]) * rescale[x / 2];
  }
}

// Keeps the compiler from touching an accumulator before the wait that completes it.
template <int Tiles>
__device__ __forceinline__ void pin_columns(float (&acc)[1][Tiles][4]) {
  wgmma::pin(all_columns(acc));
}

// The probabilities of every key of a block as PV's A fragments. fp8 ones (m16n8k32's layout per
// warp) hold keys 4q .. 4q + 3 and 16 + 4q .. 19 + 4q of each 32 in lane q = lane % 4, where the
// accumulator holds 2q, 2q + 1, 8 + 2q, 9 + 2q, ...: key k of the fragment's order is key
// p_key(k) of the block's, in which order the tma kernel transposes V.
template <class Tr>
__device__ __forceinline__ void probability_fragments(ProbabilityFragments<Tr>& a,
                                                      const float (&s)[1][Tr::s_tiles][4]) {
#pragma unroll
  for (int kk = 0; kk < Tr::block_n / (Tr::q_fp8 ? 32 : 16); ++kk) {
    if constexpr (Tr::q_fp8) {
      const auto pack = [&](int t, int half) {
        return fp8x4_from_floats<typename Tr::Q>(s[0][t][2 * half], s[0][t][2 * half + 1],
                                                 s[0][t + 1][2 * half], s[0][t + 1][2 * half + 1]);
      };
      a[kk][0] = pack(4 * kk, 0);
      a[kk][1] = pack(4 * kk, 1);
      a[kk][2] = pack(4 * kk + 2, 0);
      a[kk][3] = pack(4 * kk + 2, 1);
    } else {
      probability_fragment<typename Tr::Q>(a[kk], s, kk);
    }
  }
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::WgmmaTraits<Spec>::threads, 1)
    attention_forward_wgmma(const KILN_GRID_CONSTANT AttentionParams p) {
  using namespace attention;
  using Tr = WgmmaTraits<Spec>;
  using Q = typename Tr::Q;
  using KV = typename Tr::KV;
  static_assert(Tr::block_n % 64 == 0,
                "attention_forward_wgmma takes block_n 64, 128, 192 or 256 (176 is the tma "
                "kernel's).");

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  const unsigned smem_raw = mma::smem_address(wgmma_smem);
  const unsigned q_tile = (smem_raw + 1023) & ~1023u;
  const unsigned kv_base = q_tile + Tr::q_bytes;
  typename Tr::Out* const staging =
      reinterpret_cast<typename Tr::Out*>(wgmma_smem + (q_tile - smem_raw));

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
  const int warpgroup = warp / 4;
  const int row0 = row_begin + warp * Tr::rows_per_warp + lane / 4;
  const auto transform = make_logit_transform<Spec, mma::ApproxMath, 2>(p, seq, band, row0);
  const float to_log2 = transform.to_log2();

  const Q* const q = static_cast<const Q*>(p.q) + seq.q_offset + row_begin * p.q_seq_stride;
  const auto kv = sequence_kv<Spec, KV>(p, seq);
  auto load_kv = [&](int block, int slot) {
    const int key0 = block * Tr::block_n;
    const unsigned k_tile = kv_base + slot * Tr::slot_bytes;
    load_tile_swizzled<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::threads>(
        k_tile, kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, seq.seqlen_k - key0, thread);
    load_tile_swizzled<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::threads>(
        k_tile + Tr::k_bytes, kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride,
        seq.seqlen_k - key0, thread);
  };

  // Prologue: Q joins the first group; stages - 1 groups, empty or not, stay in flight so that
  // the loop's wait count is one constant.
  load_tile_swizzled<Tr::block_m, Tr::head_dim, Tr::qk_dim, Tr::threads>(
      q_tile, q, p.q_seq_stride, row_end - row_begin, thread);
#pragma unroll
  for (int stage = 0; stage < Tr::stages - 1; ++stage) {
    if (blocks.begin + stage < blocks.end) load_kv(blocks.begin + stage, stage);
    mma::cp_async_commit();
  }

  float o[1][Tr::o_tiles][4];
  zero_fragments(o);
  OnlineSoftmax<1> softmax;
  softmax.init();

  // This warpgroup's 64 rows of Q; 8-row groups are 1024 bytes apart in every chunk.
  const unsigned q_rows = q_tile + warpgroup * 64 * 128;
  int read_slot = 0;
  for (int block = blocks.begin; block < blocks.end; ++block) {
    mma::cp_async_wait<Tr::stages - 2>();
    wgmma::fence_shared_for_async();
    __syncthreads();  // the tile is visible to all, and every warpgroup is done with the oldest
    const int write_slot = read_slot == 0 ? Tr::stages - 1 : read_slot - 1;
    if (block + Tr::stages - 1 < blocks.end) load_kv(block + Tr::stages - 1, write_slot);
    mma::cp_async_commit();

    const unsigned k_tile = kv_base + read_slot * Tr::slot_bytes;
    const unsigned v_tile = k_tile + Tr::k_bytes;

    float s[1][Tr::s_tiles][4];
    start_scores<Tr>(s, q_rows, k_tile);
    wgmma::wait<0>();
    pin_columns(s);

    const int key0 = block * Tr::block_n + 2 * (lane % 4);
    transform.apply(s, key0, blocks.needs_mask(block, Tr::block_n),
                    [&] { mask_logits(s, band, row0, key0); });
    softmax.update(s, o, to_log2);

    unsigned a[Tr::block_n / 16][4];
    probability_fragments<Tr>(a, s);
    start_output<Tr>(o, a, v_tile);
    wgmma::wait<0>();
    pin_columns(o);

    read_slot = read_slot == Tr::stages - 1 ? 0 : read_slot + 1;
  }

  store_row_block<Tr>(p, seq, rows, transform, softmax, o, to_log2, staging, row0, thread, warp,
                      lane);
}

}  // namespace kiln
