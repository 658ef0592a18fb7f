// SPDX-License-Identifier: Apache-2.0
// Forward attention on Hopper (sm_90a), warp-specialized: a producer warp streams Q, K and V
// tiles with TMA (cp.async.bulk.tensor) into the 128-byte-swizzled layout wgmma reads, signalling
// shared-memory mbarriers; block_m / 64 consumer warpgroups compute as forward_wgmma.cuh does,
// each on 64 query rows, and hand each K/V slot back through an mbarrier when done with it. No
// CTA-wide barrier in the key loop. The grid is persistent, a CTA per SM taking tile after tile
// (TileScheduler), so that a tile's loads run under the last one's products. Where shared memory
// has room for an output staging tile (attention_forward_tma_staged: head dims up to 128) a
// tile's output leaves by bulk copies under the next one's products; otherwise each thread
// stores its accumulators. The producer warpgroup hands registers back (setmaxnreg) to the
// consumers.
//
// Spec constants: those of attention_forward_wgmma (block_m, block_n, stages). With two consumer
// warpgroups (block_m 128) they take turns at the tensor cores (ping-pong, below); with three
// (192) the scheduler interleaves them.
//
// Keys past a sequence's end get probability 0, and their V rows are zeros whatever memory holds
// there: TMA reads zeros past the tensor's token dim, and the producer zeroes the rest of the
// block that holds a sequence's last key (a varlen neighbour's rows, or rows past seqused_k).
//
// Launch: grid (x) at most one CTA per SM, and at most the tile count, ceil(seqlen_q / block_m) *
// heads * batch; block (block_m / 64 + 1) * 128 threads; dynamic shared memory
// attention_forward_tma_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size,
// kv_size, out_size); the
// argument is an AttentionTmaParams whose tensor maps have boxes of 64 columns by block_m (q)
// and block_n (k, v) rows.
#pragma once

#include "attention/prefill/forward_wgmma.cuh"
#include "common/tma.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct TmaTraits : WgmmaTraits<Spec> {
  using Base = WgmmaTraits<Spec>;
  static constexpr int consumer_groups = Base::block_m / 64;
  static constexpr int consumer_threads = consumer_groups * 128;
  static constexpr int threads = consumer_threads + 128;  // and the producer warpgroup
  // setmaxnreg counts: the producer keeps 40 beside two consumer warpgroups (walking the tiles
  // under a band it needs them; with 24 it spilled 68-92 bytes, while the consumers do not spill
  // at the 232 left to them) and 24, the least there is, beside three (whose 160 each are tight).
  // The consumers take what the CTA was launched with beyond that, at most 240 (multiples of 8).
  // A count the launch did not provide makes setmaxnreg.inc wait forever.
  static constexpr int launch_registers = 65536 / threads / 8 * 8;  // per thread, as ptxas gives
  static constexpr int producer_registers = consumer_groups == 2 ? 40 : 24;
  static constexpr int spare_registers =
      (launch_registers * threads - producer_registers * 128) / consumer_threads / 8 * 8;
  static constexpr int consumer_registers = spare_registers < 240 ? spare_registers : 240;
  static_assert(producer_registers * 128 + consumer_registers * consumer_threads <=
                    launch_registers * threads,
                "the warpgroups' registers do not fit what the CTA is launched with.");
  // Whether an output staging tile follows the Q and K/V tiles (attention_forward_tma_staged).
  static constexpr bool staged =
      attention_forward_tma_staged(Base::head_dim, Base::head_dim_v, Base::block_m, Base::block_n,
                                   Base::stages, Base::q_size, Base::kv_size, Base::out_size);
  static constexpr int staging_offset = Base::q_bytes + Base::stages * Base::slot_bytes;
};

// The grid's tiles, numbered in the order the CTAs take them. The (batch, head) pairs
// fall into sections of section_pairs neighbours, whose K and V the host sized to stay in L2
// together; a section's tiles come before the next section's, and within one the last row block
// of every pair comes first (under a causal band it has the most keys), then the one before it,
// so the heaviest tiles start first and the lightest fill the tail.
template <class Spec, int BlockM, int BlockN>
struct TileOrder {
  const AttentionParams& p;
  int section_pairs;

  __device__ __forceinline__ int row_blocks() const { return (p.seqlen_q + BlockM - 1) / BlockM; }
  __device__ __forceinline__ int count() const { return row_blocks() * p.heads * p.batch; }

  __device__ __forceinline__ Tile tile(int index) const {
    const int per_section = row_blocks() * section_pairs;
    const int first_pair = index / per_section * section_pairs;
    const int pairs = min(section_pairs, p.heads * p.batch - first_pair);
    const int within = index - first_pair * row_blocks();
    const int pair = first_pair + within % pairs;
    return make_tile<Spec, BlockM, BlockN>(p, pair / p.heads, pair % p.heads,
                                           row_blocks() - 1 - within / pairs);
  }
};

// Hands tiles to the persistent CTAs: each starts with the tile of its own index, then takes the
// next one nobody has from a counter in global memory, so that a CTA that drew light tiles takes
// more. The counter ({next, finished CTAs}) starts zero and is left zero: the last CTA to finish
// resets it, which no other CTA of the launch can still touch, and the stream orders launches.
// Without one (null: the host had none for this stream) each CTA takes every gridDim.x-th tile.
struct TileScheduler {
  unsigned* counter;

  __device__ __forceinline__ int first() const { return static_cast<int>(blockIdx.x); }
  // The tile after `current`; the whole warp calls it and gets the same answer.
  __device__ __forceinline__ int next(int current) const {
    if (counter == nullptr) return current + static_cast<int>(gridDim.x);
    unsigned taken = 0;
    if (threadIdx.x % 32 == 0) taken = gridDim.x + atomicAdd(&counter[0], 1u);
    return static_cast<int>(__shfl_sync(0xffffffffu, taken, 0));
  }
  // One thread of each CTA, after the CTA's last next().
  __device__ __forceinline__ void finish() const {
    if (counter == nullptr) return;
    __threadfence();  // this CTA's takes are seen before its finish
    if (atomicAdd(&counter[1], 1u) == gridDim.x - 1) {
      atomicExch(&counter[0], 0u);
      atomicExch(&counter[1], 0u);
    }
  }
};

// Stores a thread's output rows (row0 and row0 + 8, those before row_end) from its accumulators
// where there is no room to stage them: a quad writes 16 bytes of a row per n8 tile, which L2
// gathers into whole sectors.
template <class Tr>
__device__ __forceinline__ void store_output(typename Tr::Out* out, long long row_stride,
                                             const float (&o)[1][Tr::o_tiles][4], int row0,
                                             int row_end, int lane) {
  using T = typename Tr::Out;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half;
    if (row >= row_end) continue;
    T* const columns = out + row * row_stride + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < Tr::o_tiles; ++j) {
      if (j * 8 < Tr::head_dim_v) {  // the tiles past head_dim_v hold padding
        *reinterpret_cast<unsigned*>(columns + j * 8) =
            mma::pack2<T>(o[0][j][2 * half], o[0][j][2 * half + 1]);
      }
    }
  }
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::TmaTraits<Spec>::threads, 1)
    attention_forward_tma(const KILN_GRID_CONSTANT AttentionTmaParams tp) {
  using namespace attention;
  using Tr = TmaTraits<Spec>;
  using Out = typename Tr::Out;
  const AttentionParams& p = tp.p;

  extern __shared__ __align__(1024) unsigned char tma_smem[];
  // The tile that Q's slot holds, written by the producer before it signals q_full (-1: none
  // left). Q's slot is handed back once a tile's last scores are in, so the next tile's Q loads
  // under the tile's last product and its output stores.
  __shared__ int q_tile_index;
  __shared__ unsigned long long q_full, q_empty;
  // K and V of a slot have barriers of their own: a warpgroup is done with K once its scores are
  // in, well before it is done with V, and the next K load need not wait for V.
  __shared__ unsigned long long k_full[Tr::stages], k_empty[Tr::stages];
  __shared__ unsigned long long v_full[Tr::stages], v_empty[Tr::stages];
  // A V block that holds its sequence's last key lands here instead: its rows past that key are
  // zeroed before v_full is signalled (see the producer).
  __shared__ unsigned long long v_tail;
  unsigned char* const tiles = tma_smem + (1024 - mma::smem_address(tma_smem) % 1024) % 1024;
  const unsigned q_tile = mma::smem_address(tiles);
  const unsigned kv_base = q_tile + Tr::q_bytes;

  const int thread = threadIdx.x;
  constexpr unsigned consumer_warps = Tr::consumer_threads / 32;  // one arrival from each
  if (thread == 0) {
    tma::init(&q_full, 1);
    tma::init(&q_empty, Tr::consumer_threads);  // every thread that read q_tile_index
    tma::init(&v_tail, 1);
#pragma unroll
    for (int s = 0; s < Tr::stages; ++s) {
      tma::init(&k_full[s], 1);
      tma::init(&v_full[s], 1);
      tma::init(&k_empty[s], consumer_warps);
      tma::init(&v_empty[s], consumer_warps);
    }
    tma::fence_init();
  }
  __syncthreads();

  // Barrier phases run on across tiles: the i-th K/V block a CTA loads goes to slot i % stages
  // and completes phase (i / stages) & 1 of its barriers; the n-th Q, phase n & 1 of q_full.
  const auto phase = [](int i) { return static_cast<unsigned>(i / Tr::stages) & 1; };
  const TileOrder<Spec, Tr::block_m, Tr::block_n> order{p, tp.section_pairs};

  if (thread >= Tr::consumer_threads) {
    // The producer: the first warp of the last warpgroup; its first lane issues every copy and
    // takes the tiles from the scheduler.
    tma::release_registers<Tr::producer_registers>();
    if (thread >= Tr::consumer_threads + 32) return;
    const int lane = thread % 32;
    const bool issuer = lane == 0;
    if (issuer) {
      tma::prefetch_map(&tp.q_map);
      tma::prefetch_map(&tp.k_map);
      tma::prefetch_map(&tp.v_map);
    }
    const TileScheduler scheduler{tp.maybe_tile_counter};
    int kv_count = 0, tail_count = 0, q_count = 0;
    const auto publish = [&](int index) {  // hands Q's slot to the tile `index`
      if (issuer) {
        if (q_count > 0) tma::wait(&q_empty, (q_count - 1) & 1);
        q_tile_index = index;
      }
      ++q_count;
    };
    for (int index = scheduler.first(); index < order.count(); index = scheduler.next(index)) {
      const Tile tile = order.tile(index);
      if (tile.rows.begin >= tile.rows.end) continue;
      const Sequence& seq = tile.seq;
      const int head_kv = seq.head / (p.heads / p.heads_kv);
      const int q_token = (Spec::varlen ? p.maybe_cu_seqlens_q[seq.batch] : 0) + tile.rows.begin;
      const int k_token = Spec::varlen ? p.maybe_cu_seqlens_k[seq.batch] : 0;
      const int batch = Spec::varlen ? 0 : seq.batch;
      publish(index);
      if (issuer) {
        tma::arrive_expect_tx(&q_full, Tr::q_bytes);
#pragma unroll
        for (int c = 0; c < Tr::qk_dim / 64; ++c) {
          tma::load_4d(tiles + c * Tr::block_m * 128, &tp.q_map, &q_full, 64 * c, q_token, seq.head,
                       batch);
        }
      }
      // The i-th block the CTA loads goes to slot i % stages, its K and V with barriers of
      // their own.
      const auto slot_tile = [&](int i) {
        return tiles + Tr::q_bytes + i % Tr::stages * Tr::slot_bytes;
      };
      const auto load_k = [&](int block, int i) {
        if (!issuer) return;
        const int slot = i % Tr::stages;
        if (i >= Tr::stages) tma::wait(&k_empty[slot], phase(i) ^ 1);  // the phase that freed it
        tma::arrive_expect_tx(&k_full[slot], Tr::k_bytes);
#pragma unroll
        for (int c = 0; c < Tr::qk_dim / 64; ++c) {
          tma::load_4d(slot_tile(i) + c * Tr::block_n * 128, &tp.k_map, &k_full[slot], 64 * c,
                       k_token + block * Tr::block_n, head_kv, batch);
        }
      };
      // Keys past the sequence's end get probability 0, but 0 times a NaN or infinity in their V
      // rows (another sequence's, or memory the caller never wrote) is NaN: the block holding the
      // last key is zeroed past it, as the wgmma kernel's loads do, before the consumers see it.
      // (K needs nothing: masking replaces those logits whatever they are.)
      const auto load_v = [&](int block, int i) {
        const int slot = i % Tr::stages;
        unsigned char* const v_tile = slot_tile(i) + Tr::k_bytes;
        const int valid = seq.seqlen_k - block * Tr::block_n;
        const bool tail = valid < Tr::block_n;
        unsigned long long* const landed = tail ? &v_tail : &v_full[slot];
        if (issuer) {
          if (i >= Tr::stages) tma::wait(&v_empty[slot], phase(i) ^ 1);
          tma::arrive_expect_tx(landed, Tr::slot_bytes - Tr::k_bytes);
#pragma unroll
          for (int c = 0; c < Tr::v_dim / 64; ++c) {
            tma::load_4d(v_tile + c * Tr::block_n * 128, &tp.v_map, landed, 64 * c,
                         k_token + block * Tr::block_n, head_kv, batch);
          }
        }
        if (!tail) return;
        tma::wait(&v_tail, tail_count++ & 1);
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
        if (issuer) tma::arrive(&v_full[slot]);
      };
      // K runs a block ahead of V: the consumers need block j + 1's K for its scores while block
      // j's V is still in use, so K's load need not wait for a V slot to come free.
      const int first = kv_count;
      for (int block = tile.blocks.begin; block <= tile.blocks.end; ++block) {
        const int i = first + block - tile.blocks.begin;
        if (block < tile.blocks.end) load_k(block, i);
        if (block > tile.blocks.begin) load_v(block - 1, i - 1);
      }
      kv_count += tile.blocks.end - tile.blocks.begin;
    }
    publish(-1);  // none left: the consumers stop
    if (issuer) {
      tma::arrive(&q_full);
      scheduler.finish();
    }
    return;
  }

  // The consumers.
  tma::claim_registers<Tr::consumer_registers>();
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int warpgroup = warp / 4;
  // This warpgroup's 64 rows of Q; 8-row groups are 1024 bytes apart in every chunk.
  const unsigned q_rows = q_tile + warpgroup * 64 * 128;
  const auto k_tile = [&](int slot) { return kv_base + slot * Tr::slot_bytes; };
  // This warp is done with a slot.
  const auto release = [&](unsigned long long* empty) {
    __syncwarp();
    if (lane == 0) tma::arrive(empty);
  };
  // Ping-pong: with two consumer warpgroups, each issues its products only in its turn and then
  // passes the turn on, so that one's softmax runs while the other's products keep the tensor
  // cores busy. Named barrier 2 + g is warpgroup g's turn: its 128 threads sync on it, the
  // other's 128 arrive. Both take a turn per key block of the tile they share, so the turns run
  // on from tile to tile, and one warpgroup's first products of a tile go in while the other
  // still finishes the last: the second warpgroup hands the first its first turn before any
  // tile, and the first takes the second's last hand-off after the last.
  constexpr bool ping_pong = Tr::consumer_groups == 2;
  const auto take_turn = [&] {
    if constexpr (ping_pong) tma::named_sync(2 + warpgroup, 256);
  };
  const auto pass_turn = [&] {
    if constexpr (ping_pong) tma::named_arrive(3 - warpgroup, 256);
  };
  if (ping_pong && warpgroup == 1) tma::named_arrive(2, 256);
  int kv_count = 0;
  // The tiles the producer hands over, until it has none.
  for (int q_count = 0;; ++q_count) {
    tma::wait(&q_full, q_count & 1);
    const int index = *static_cast<volatile int*>(&q_tile_index);
    if (index < 0) break;
    const Tile tile = order.tile(index);
    const Sequence& seq = tile.seq;
    const RowBlock& rows = tile.rows;
    const KeyBlocks& blocks = tile.blocks;
    const Band& band = tile.band;
    const int row0 = rows.begin + warp * Tr::rows_per_warp + lane / 4;
    const auto transform = make_logit_transform<Spec, mma::ApproxMath, 2>(p, seq, band, row0);
    const float to_log2 = transform.to_log2();

    float o[1][Tr::o_tiles][4];
    zero_fragments(o);
    // Where o is large enough for the rescale vote, a running max that lags the rows' logits by
    // up to 2^8 leaves most steps no rescale. Measured on an H100: 6% faster at head dim 256;
    // at 64, voting on every step as well, 7-9% slower.
    OnlineSoftmax<1, 128, OnlineSoftmax<1>::votes<Tr::o_tiles> ? 8 : 0> softmax;
    softmax.init();
    const auto transform_logits = [&](float(&s)[1][Tr::s_tiles][4], int block) {
      pin_columns(s);
      const int key0 = block * Tr::block_n + 2 * (lane % 4);
      transform.apply(s, key0, blocks.needs_mask(block, Tr::block_n),
                      [&] { mask_logits(s, band, row0, key0); });
    };
    const auto output_done = [&](int slot) {
      wgmma::wait<0>();
      pin_columns(o);
      release(&v_empty[slot]);
    };

    const int turns = blocks.end - blocks.begin;

    // Block j's scores are computed while block j - 1's probabilities multiply V, and its
    // softmax runs under that product; o is rescaled once the product is in. Q's slot goes back
    // once the last scores are in.
    if (turns == 0) tma::arrive(&q_empty);
    if (turns > 0) {
      float s[1][Tr::s_tiles][4];
      unsigned a[Tr::block_n / 16][4];
      int slot = kv_count % Tr::stages;
      tma::wait(&k_full[slot], phase(kv_count));
      take_turn();
      start_scores<Tr>(s, q_rows, k_tile(slot));
      pass_turn();
      wgmma::wait<0>();
      release(&k_empty[slot]);
      if (turns == 1) tma::arrive(&q_empty);
      transform_logits(s, blocks.begin);
      softmax.update(s, o, to_log2);
      probability_fragments<Tr>(a, s);
      for (int turn = 1; turn < turns; ++turn) {
        const int next = (kv_count + turn) % Tr::stages;
        tma::wait(&k_full[next], phase(kv_count + turn));
        tma::wait(&v_full[slot], phase(kv_count + turn - 1));
        take_turn();
        start_scores<Tr>(s, q_rows, k_tile(next));
        start_output<Tr>(o, a, k_tile(slot) + Tr::k_bytes);
        pass_turn();
        wgmma::wait<1>();
        release(&k_empty[next]);
        if (turn + 1 == turns) tma::arrive(&q_empty);
        transform_logits(s, blocks.begin + turn);
        float rescale[2];
        softmax.exponentiate(s, to_log2, rescale);
        output_done(slot);
        softmax.rescale_output(o, rescale);
        probability_fragments<Tr>(a, s);
        slot = next;
      }
      tma::wait(&v_full[slot], phase(kv_count + turns - 1));
      start_output<Tr>(o, a, k_tile(slot) + Tr::k_bytes);
      output_done(slot);
      kv_count += turns;
    }

    float lse[2];
    float sink[2];
    transform.sinks(sink, p.score);
    softmax.finish(o, to_log2, lse, sink);
    Out* const out = static_cast<Out*>(p.out) + seq.out_offset;
    if constexpr (Tr::staged) {
      // Each warp stages its 16 rows and copies them out with bulk copies, a row each, which run
      // while the warp goes on to the next tile; the rows are free again once the copies have
      // read them.
      Out* const staging = reinterpret_cast<Out*>(tiles + Tr::staging_offset);
      tma::wait_bulk_read<0>();
      __syncwarp();
      stage_output<Tr>(staging, o, warp, lane);
      wgmma::fence_shared_for_async();
      __syncwarp();
      const int staged_row = warp * Tr::rows_per_warp + lane;
      const int row = rows.begin + staged_row;
      if (lane < Tr::rows_per_warp && row < rows.end) {
        tma::store_bulk(out + row * p.out_seq_stride,
                        mma::smem_address(staging + staged_row * Tr::v_pitch),
                        Tr::head_dim_v * Tr::out_size);
      }
      tma::commit_bulk();
    } else {
      store_output<Tr>(out, p.out_seq_stride, o, row0, rows.end, lane);
    }
    if (p.maybe_lse != nullptr)
      store_lse<Tr>(p.maybe_lse + seq.lse_offset, lse, row0, seq.seqlen_q, lane);
  }
  if (ping_pong && warpgroup == 0) take_turn();
  if constexpr (Tr::staged) tma::wait_bulk<0>();  // the copies are done before the CTA exits
}

}  // namespace kiln
