// SPDX-License-Identifier: Apache-2.0
// The backward pass on Hopper (sm_90a), warp-specialized: FlashAttention-2's recomputation with
// every product a wgmma.mma_async, Q and dO streamed by TMA, and dQ added across key blocks to
// fp32 accumulators by bulk reductions (with `deterministic`, in a fixed order: add_in_turn), or
// where the head dims are split and the order is free, by vector reductions from registers.
//   attention_backward_dkdv_wgmma: a CTA per (block_n keys, kv head, batch) holds its keys' K and
//     V tiles in shared memory and streams the query rows that attend them, block_m at a time,
//     for every query head of the group. Its warpgroups:
//     - consumers that hold their keys' dK and dV in registers: block_n / 64 of them, one per
//       64 keys, up to head dims 128; above, two over 64 keys that split the head dims, each
//       holding dK and dV for its half of the columns and computing S^T and dP^T for half of
//       the step's queries (shared_probs). Per streamed block, with the scores transposed (keys
//       as the wgmma's M, so that P^T and dS^T are A operands straight from registers, unless
//       shared_probs):
//         S^T = K Q^T and dP^T = V dO^T (both operands in shared memory), P^T = exp(logit -
//         lse), dS^T = P^T (dP^T - D) d logit / d score (with has_dbias, P^T (dP^T - D) also goes
//         to bp.maybe_dbias_accum, as the mma kernel's), dV += P^T dO (A in registers);
//       then dS^T goes to shared memory (two buffers, so that one warpgroup's next block never
//       overwrites what the other still reads), and dQ = dS K (A read transposed) and dK += dS^T
//       Q run together; dQ's share of each warpgroup is staged in fp32 while dK's products run
//       (staged_dq), or added to the accumulators from its registers (red.global.add.v2).
//       With shared_probs P^T goes to shared memory beside dS^T (two buffers too), and dV and dK
//       read both from there whole, after dQ's products.
//     - a producer warpgroup (its registers handed to the consumers): warp 0 streams Q and dO
//       into two slots (one where the head dims are split and dQ staged: the staging block
//       takes the second's memory) with TMA, on mbarriers; with staged_dq warp 1 adds each
//       staged dQ block to bp.maybe_dq_accum with one cp.reduce.async.bulk. Warp 2 writes the
//       rows' LSE (in log2 units) and D for each slot.
//   attention_backward_dq_wgmma: converts the accumulators into dq, in q's dtype and dq's layout.
// D = rowsum(dO * O) comes from attention/backward/dot.cuh, the zeroed accumulators from the
// host. The logit, mask and gradient steps are the mma kernel's (backward_mma.cuh): a warp's 16
// rows of a wgmma accumulator are laid out as an mma.sync one.
//
// The accumulators (bp.maybe_dq_accum) hold head_dim floats a query row at the LSE's offsets,
// each row's 16-byte pieces rotated by twice its index (dq_accum_rotation), so that the staging
// writes of a warp's eight rows fall in distinct banks (the additions from registers keep the
// layout, which the dq kernel reads). A block's additions cover its rows of the sequence alone.
//
// Rows past a sequence's end read as zeros: TMA fills them past the tensor's token dim, and with
// varlen (where the next sequence's rows follow, or rows nobody wrote) the producer zeroes them.
//
// Spec constants: as attention_backward_dkdv_mma's (has_dbias the dk/dv kernel's), with
//   block_n   64 or 128: keys a CTA holds, 64 for each consumer key group.
//   warps     the consumers' warps: block_n / 16 (a warpgroup per 64 keys; with one, two CTAs
//             share an SM), or 8 over block_n 64 (two warpgroups that split the head dims).
//   block_m   64 or 128, at most block_n (64 where the head dims are split): query rows a step.
//             dQ's block_m x head_dim is split between the consumers, each taking 64 rows and a
//             multiple of 64 of the columns.
//   deterministic  whether dQ's additions take a fixed order (bp.maybe_dq_semaphore), every
//             step then one of the sequence's blocks of block_m rows (RowSteps' Ordered: each
//             head's last block first).
// head_dim and head_dim_v are padded with zeros to multiples of 64 (the swizzle width) times the
// column groups, at most 128 a warpgroup.
//
// Launch, after attention_backward_dot and with bp.maybe_dq_accum (and with deterministic,
// bp.maybe_dq_semaphore) zeroed: dkdv on grid
// (ceil(seqlen_k / block_n), heads_kv, batch), seqlen_k the longest sequence's stored keys,
// (warps + 4) * 32 threads, dynamic shared memory attention_backward_wgmma_smem_bytes(head_dim,
// head_dim_v, block_m, block_n, warps, deterministic) from "kiln/params/attention_backward.h",
// bp.q_map and bp.dout_map 4-d tensor maps of q and dout with boxes of 64 columns by block_m
// rows; then dq on grid (ceil(seqlen_q / block_m), heads, batch), as many threads, no shared
// memory.
#pragma once

#include "attention/backward/backward_mma.cuh"
#include "attention/core/lane_chunks.cuh"
#include "attention/prefill/forward_wgmma.cuh"
#include "common/pipeline.cuh"
#include "common/wgmma.cuh"

namespace kiln {
namespace attention {

// What the dq kernel takes of a spec too: the CTA's threads (the consumer warps and the producer
// warpgroup), and a row of the accumulators: dq_pieces 16-byte pieces.
template <class Spec>
struct BackwardWgmmaAccum {
  static constexpr int threads = static_cast<int>(Spec::warps) * 32 + 128;
  static constexpr int dq_pieces = static_cast<int>(Spec::head_dim) / 4;
};

template <class Spec>
struct BackwardWgmmaTraits : HeadTraits<Spec>, BackwardWgmmaAccum<Spec> {
  using T = typename HeadTraits<Spec>::Q;
  using HeadTraits<Spec>::head_dim;
  using HeadTraits<Spec>::head_dim_v;

  static constexpr int block_m = static_cast<int>(Spec::block_m);
  static constexpr int block_n = static_cast<int>(Spec::block_n);
  static constexpr int warps = static_cast<int>(Spec::warps);
  static constexpr int warpgroups = warps / 4;  // consumers
  static constexpr int consumer_threads = warps * 32;
  using BackwardWgmmaAccum<Spec>::threads;
  static_assert(block_n == 64 || block_n == 128, "block_n must be 64 or 128: 64 keys a warpgroup.");
  static_assert(warps == block_n / 16 || (warps == 8 && block_n == 64),
                "warps must be block_n / 16 (a warpgroup per 64 keys), or 8 over block_n 64 (two "
                "warpgroups that split the head dims).");
  // The consumers split the keys (key_groups of 64) or the head dims (column_groups): a
  // warpgroup is key group warpgroup % key_groups, column group warpgroup / key_groups. A
  // column group holds dK and dV for its share of the head dims and computes S^T and dP^T for
  // its share of the step's queries, score_cols of them; P^T and dS^T then go through shared
  // memory (shared_probs), where every column group reads them whole.
  static constexpr int key_groups = block_n / 64;
  static constexpr int column_groups =
      static_cast<int>(attention_backward_wgmma_column_groups(block_n, warps));
  static_assert(key_groups * column_groups == warpgroups && (key_groups == 1 || column_groups == 1),
                "the consumers split keys or head dims.");
  static_assert((block_m == 64 || block_m == 128) && block_m <= block_n,
                "block_m must be 64 or 128, at most block_n.");
  static constexpr int score_cols = block_m / column_groups;
  static constexpr bool shared_probs = column_groups > 1;

  // With one consumer two CTAs share an SM, so that one's products run while the other's
  // softmax work and barriers do. Either way the producer keeps 24 registers (setmaxnreg) and
  // the consumers take the rest of what the CTA is launched with: 168 a thread beside two
  // consumers, 128 beside one.
  static constexpr int ctas_per_sm = attention_backward_wgmma_ctas_per_sm(warps);
  static constexpr int producer_registers = 24;
  static constexpr int consumer_registers = warpgroups == 1 ? 232 : 240;
  static_assert(producer_registers * 128 + consumer_registers * consumer_threads <=
                    attention_backward_wgmma_least_registers(warps) * threads,
                "the warpgroups' registers do not fit what the CTA is launched with.");

  static constexpr int qk_dim =
      static_cast<int>(attention_backward_wgmma_padded_dim(head_dim, block_n, warps));
  static constexpr int v_dim =
      static_cast<int>(attention_backward_wgmma_padded_dim(head_dim_v, block_n, warps));
  // A warpgroup's columns of dK and dV, which stay in its registers.
  static constexpr int qk_cols = qk_dim / column_groups;
  static constexpr int v_cols = v_dim / column_groups;
  static_assert(qk_cols <= 128 && v_cols <= 128,
                "a warpgroup holds dK and dV for up to 128 head dims: above 128, split them (warps "
                "8 over block_n 64).");
  // Whether dQ goes through the staging block and the dQ warp, or straight from the consumers'
  // registers to the accumulators; and the slots of streamed rows.
  static constexpr bool staged_dq =
      attention_backward_wgmma_staged_dq(block_n, warps, Spec::deterministic);
  static constexpr int stages =
      static_cast<int>(attention_backward_wgmma_stages(block_n, warps, Spec::deterministic));

  // The per-warp fragment shapes of the mma kernel's helpers: a warp's 16 keys against
  // score_cols query columns.
  static constexpr int s_tiles = score_cols / 8;

  // dQ's split: warpgroup w takes 64 rows, dq_m_tile(w), and dq_cols columns from dq_col(w).
  static constexpr int dq_m_tiles = block_m / 64;
  static constexpr int dq_cols =
      static_cast<int>(attention_backward_wgmma_dq_cols(head_dim, block_m, block_n, warps));
  static_assert(dq_cols % 64 == 0,
                "dQ's columns split between warpgroups in multiples of 64: raise block_m.");
  using BackwardWgmmaAccum<Spec>::dq_pieces;

  // Shared memory from the 1024-aligned base: K, V, two dS^T buffers (block_n rows of block_m)
  // and with shared_probs two P^T buffers after them, then with staged_dq the dQ staging block
  // (block_m rows of head_dim floats, as the accumulators lay them out) and `stages` slots of Q,
  // dO and their rows' LSE and D; without, the slots of Q and dO, then every slot's LSE and D
  // (row_bytes each) in one block. The tiles, the staging block, the slots and that block start
  // 1024-aligned.
  static constexpr int k_bytes = block_n * qk_dim * 2;
  static constexpr int v_bytes = block_n * v_dim * 2;
  static constexpr int ds_bytes = block_n * block_m * 2;
  static constexpr int dq_bytes = block_m * head_dim * 4;
  static constexpr int q_bytes = block_m * qk_dim * 2;
  static constexpr int dout_bytes = block_m * v_dim * 2;
  static constexpr int row_bytes = 2 * block_m * 4;  // a slot's LSE and D
  static constexpr int slot_bytes =
      staged_dq ? round_up(q_bytes + dout_bytes + row_bytes, 1024) : q_bytes + dout_bytes;
  static constexpr int ds_offset = k_bytes + v_bytes;
  static constexpr int dq_offset = ds_offset + 2 * column_groups * ds_bytes;
  static constexpr int slots_offset = dq_offset + (staged_dq ? round_up(dq_bytes, 1024) : 0);
  static constexpr int slots_end = slots_offset + stages * slot_bytes;
  static_assert(slot_bytes % 1024 == 0,
                "a slot's Q and dO are whole 1024-byte swizzle atoms: pad the head dims to 64.");
  static constexpr long long smem_bytes = attention_backward_wgmma_smem_bytes(
      head_dim, head_dim_v, block_m, block_n, warps, Spec::deterministic);
  static_assert(smem_bytes ==
                    1024 + slots_end + (staged_dq ? 0 : round_up(stages * row_bytes, 1024)),
                "attention_backward_wgmma_smem_bytes disagrees with the kernel's layout.");
  // With the 1 KB the compiler pads the barriers' static shared memory to (the dynamic part's
  // alignment).
  static_assert(smem_bytes + 1024 <= 227 * 1024,
                "the tiles do not fit sm_90a's 227 KB of shared memory: lower block_m or block_n.");
  // dK and dV are staged through the tiles' memory (rows padded as the mma kernel's) to store.
  static constexpr int qk_pitch = qk_dim + 8;
  static constexpr int v_pitch = v_dim + 8;
  static_assert(block_n * (qk_pitch + v_pitch) * 2 <= dq_offset,
                "dK and dV's staging does not fit the tiles.");
};

// Where the producer and the consumers meet: the Q/dO slots' barriers (static shared memory), and
// the named barriers (1 to 15; 0 is __syncthreads, which this kernel never uses once the
// producer's idle warps have left).
template <class Tr>
struct BackwardWgmmaBarriers {
  tma::Pipeline<Tr::stages> rows;  // a slot's Q, dO and row values
  // A slot whose rows run past a varlen sequence's end lands here: the producer zeroes those
  // rows, then arrives on rows.full itself.
  tma::BarrierRing<1> tail;

  static constexpr int kv_loaded = 1;  // the consumers: K and V are in shared memory
  static constexpr int ds_stored = 2;  // the consumers: a block's dS^T (and P^T) is whole
  static constexpr int dq_free = 3;    // the dQ warp's arrival: the staging block was read
  static constexpr int dq_staged = 4;  // the consumers' arrivals: a block's dQ is staged
  static constexpr int dq_threads = Tr::consumer_threads + 32;

  // Every thread that writes a slot arrives on its full barrier (the producer warp's lanes, its
  // first with the TMA bytes, and the row warp's), and every consumer thread that read it on its
  // empty one: an arrival releases the arriving thread's own accesses only.
  __device__ __forceinline__ void init() {
    rows.init(64, Tr::consumer_threads);
    tail.init(1);
    tma::fence_init();
  }
};

// The rotation of accumulator row `row`: its 16-byte piece p lies at piece (p + rotation) %
// dq_pieces (Tr a BackwardWgmmaAccum).
template <class Tr>
__device__ __forceinline__ int dq_accum_rotation(long long row) {
  return static_cast<int>(2 * (row % (Tr::dq_pieces / 2)));
}

// Calls add(at, x, y) for each column pair (x, y) of a warpgroup's 64-row fp32 dQ accumulator of
// Cols columns from col0, `at` its place in rows laid out as the accumulators' (rows of head_dim
// floats, rotated), for rows row0 + the fragment's row below `rows` (block_m: all), whose first
// lies at accumulator row `accum_row0`: row_at(row) is the start of row `row` plus the lane's
// offset in a 16-byte piece, (lane % 2) * 2 floats. Columns from head_dim on are padding and
// dropped.
template <class Tr, int Cols, class RowAt, class Add>
__device__ __forceinline__ void for_dq_pairs(const float (&acc)[Cols / 2], long long accum_row0,
                                             int rows, int row0, int col0, int lane,
                                             const RowAt& row_at, const Add& add) {
  constexpr int pieces = Tr::dq_pieces;
  const int rotation0 = dq_accum_rotation<Tr>(accum_row0);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + lane / 4 + 8 * half;
    if (rows < Tr::block_m && row >= rows) continue;
    float* const at = row_at(row);
    // The lane's first piece, rotated; its column's pair lies at (lane % 2) * 2 in it.
    const int piece0 = (col0 / 4 + (lane % 4) / 2 + rotation0 + 2 * row) % pieces;
#pragma unroll
    for (int j = 0; j < Cols / 8; ++j) {
      if (Tr::head_dim < Tr::qk_dim && col0 + 8 * j >= Tr::head_dim) break;
      add(at + (piece0 + 2 * j) % pieces * 4, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

// Stages that accumulator into the staging block at `staged` (rows of head_dim floats, the
// accumulators' layout), its first row at row0 of the block.
template <class Tr, int Cols>
__device__ __forceinline__ void stage_dq(float* staged, const float (&acc)[Cols / 2],
                                         long long accum_row0, int row0, int col0, int lane) {
  for_dq_pairs<Tr, Cols>(
      acc, accum_row0, Tr::block_m, row0, col0, lane,
      [&](int row) { return mma::opaque(staged + row * Tr::head_dim + (lane % 2) * 2); },
      [](float* at, float x, float y) { *reinterpret_cast<float2*>(at) = make_float2(x, y); });
}

// Adds it to the accumulators (from accum, rows of head_dim floats) straight from registers, its
// first row at row row0 of accumulator row accum_row0's block; rows from `rows` on (past the
// sequence's end) left out.
template <class Tr, int Cols>
__device__ __forceinline__ void add_dq(float* accum, const float (&acc)[Cols / 2],
                                       long long accum_row0, int rows, int row0, int col0,
                                       int lane) {
  for_dq_pairs<Tr, Cols>(
      acc, accum_row0, rows, row0, col0, lane,
      [&](int row) { return accum + (accum_row0 + row) * Tr::head_dim + (lane % 2) * 2; },
      [](float* at, float x, float y) { tma::reduce_add_pair(at, x, y); });
}

// Deterministic dQ: the dQ warp's `add` of step `at` (a block of block_m rows, the steps
// aligned) waits for the turn of this CTA's key block among those that add to the same rows,
// in the order of their blockIdx.x, and is whole in global memory before the next one's. Each
// element then sums its key blocks' shares in one order, whatever the timing.
//
// A CTA waits only on CTAs of its own (head, batch) with a smaller blockIdx.x: blockIdx.x varies
// fastest, and this relies on the hardware starting a launch's CTAs in the order of their linear
// index (as FlashAttention-3's deterministic backward does; CUDA does not promise it), so that
// those CTAs have started, or ended, when this one waits, and make progress without it.
//
// A varlen sequence longer than the call's max_seqlen_q (an invalid call: the row dots and dq
// stop at max_seqlen_q) would have row blocks past its counters: its additions there are made
// unordered, rather than indexing another head's counter and waiting forever.
template <class Tr, class Add>
__device__ __forceinline__ void add_in_turn(const AttentionBackwardParams& bp,
                                            const KeyBlockTile& tile,
                                            const RowSteps<Tr::block_m, true>& steps, RowStep at,
                                            int lane, const Add& add) {
  const int block = at.r0 / Tr::block_m;
  if (block >= bp.dq_row_blocks) {
    if (lane == 0) {
      add();
      tma::wait_bulk_read<0>();
    }
    return;
  }
  // The key blocks before this one whose steps include the block: every lane counts some.
  int before = 0;
  for (int n = lane; n * Tr::block_n < tile.key0; n += 32) {
    const RowBlock rows = key_block_rows<Tr::block_n>(tile.band, n * Tr::block_n,
                                                      tile.first.seqlen_q, tile.first.seqlen_k);
    before += rows.begin < rows.end && steps.first_row(rows) <= at.r0 && at.r0 < rows.end;
  }
  before = __reduce_add_sync(0xffffffffu, before);
  if (lane == 0) {
    int* const semaphore =
        bp.maybe_dq_semaphore +
        (static_cast<long long>(tile.batch) * bp.fwd.heads + at.head) * bp.dq_row_blocks + block;
    while (tma::load_acquire(semaphore) != before) __nanosleep(64);
    // The earlier key blocks' additions, acquired through the generic proxy, ordered before
    // this one's, made through the async proxy.
    tma::fence_proxy_async_global();
    add();
    tma::wait_bulk<0>();              // the additions are done
    tma::fence_proxy_async_global();  // and ordered before the release
    tma::add_release(semaphore, 1);
  }
}

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::BackwardWgmmaTraits<Spec>::threads,
                                  attention::BackwardWgmmaTraits<Spec>::ctas_per_sm)
    attention_backward_dkdv_wgmma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardWgmmaTraits<Spec>;
  using Bars = BackwardWgmmaBarriers<Tr>;
  using T = typename Tr::T;
  using RowsState = tma::PipelineState<Tr::stages>;
  const AttentionParams& p = bp.fwd;

  extern __shared__ __align__(1024) unsigned char wgmma_smem[];
  __shared__ Bars bars;
  unsigned char* const base = wgmma_smem + (1024 - mma::smem_address(wgmma_smem) % 1024) % 1024;
  const unsigned k_tile = mma::smem_address(base);
  const unsigned v_tile = k_tile + Tr::k_bytes;
  // Buffer 0 or 1 of dS^T, or with shared_probs (probs) of P^T.
  const auto ds_tile = [&](int buffer, bool probs = false) {
    return k_tile + Tr::ds_offset + (2 * probs + buffer) * Tr::ds_bytes;
  };
  float* const dq_staged = reinterpret_cast<float*>(base + Tr::dq_offset);
  const auto slot_tile = [&](int slot) { return base + Tr::slots_offset + slot * Tr::slot_bytes; };
  // Value f (0: LSE in log2 units, 1: D) of the streamed rows of a slot.
  const auto row_floats = [&](int slot, int f) {
    unsigned char* const values = Tr::staged_dq ? slot_tile(slot) + Tr::q_bytes + Tr::dout_bytes
                                                : base + Tr::slots_end + slot * Tr::row_bytes;
    return reinterpret_cast<float*>(values) + f * Tr::block_m;
  };

  const KeyBlockTile tile = key_block_tile<Spec, Tr::block_n>(p);
  const int key0 = tile.key0;
  if (key0 >= tile.stored) return;
  const int thread = static_cast<int>(threadIdx.x);
  const int warp = thread / 32;
  const int lane = thread % 32;
  if (thread == 0) bars.init();
  __syncthreads();

  const Sequence& first = tile.first;
  const Band& band = tile.band;
  const int batch = tile.batch;
  const RowSteps<Tr::block_m, Spec::deterministic> steps(tile);

  if (thread >= Tr::consumer_threads) {
    tma::release_registers<Tr::producer_registers>();
    if (warp == Tr::warps) {
      // The producer: Q and dO by TMA, the rows' LSE and D by every lane.
      if (lane == 0) {
        tma::prefetch_map(&bp.q_map);
        tma::prefetch_map(&bp.dout_map);
      }
      const int token0 = Spec::varlen ? p.maybe_cu_seqlens_q[batch] : 0;
      const int map_batch = Spec::varlen ? 0 : batch;
      RowsState at_slot{};
      tma::PipelineState<1> tail_at{};
      for (RowStep at = steps.first(); !steps.done(at); at = steps.after(at), at_slot.advance()) {
        bars.rows.acquire(at_slot);  // every lane: a tail's zeros are written by all
        const int slot = at_slot.slot();
        const int valid = locate_sequence<Spec::varlen>(p, batch, at.head).seqlen_q - at.r0;
        const bool tail = Spec::varlen && valid < Tr::block_m;
        unsigned long long* const landed =
            tail ? bars.tail.at(tail_at) : bars.rows.full.at(at_slot);
        unsigned char* const q_tile = slot_tile(slot);
        unsigned char* const dout_tile = q_tile + Tr::q_bytes;
        if (!tail && lane > 0) bars.rows.full.arrive(at_slot);
        if (lane == 0) {
          tma::arrive_expect_tx(landed, Tr::q_bytes + Tr::dout_bytes);
#pragma unroll
          for (int c = 0; c < Tr::qk_dim / 64; ++c) {
            tma::load_4d(q_tile + c * Tr::block_m * 128, &bp.q_map, landed, 64 * c, token0 + at.r0,
                         at.head, map_batch);
          }
#pragma unroll
          for (int c = 0; c < Tr::v_dim / 64; ++c) {
            tma::load_4d(dout_tile + c * Tr::block_m * 128, &bp.dout_map, landed, 64 * c,
                         token0 + at.r0, at.head, map_batch);
          }
        }
        if (tail) {
          bars.tail.wait(tail_at);
          tail_at.advance();
          // Whole 128-byte rows of every chunk of Q and dO (adjacent tiles of block_m rows).
          constexpr int pieces = Tr::block_m * 8;  // per 64-column chunk
          for (int c = 0; c < (Tr::qk_dim + Tr::v_dim) / 64; ++c) {
            uint4* const chunk = reinterpret_cast<uint4*>(q_tile + c * Tr::block_m * 128);
            for (int piece = valid * 8 + lane; piece < pieces; piece += 32) {
              chunk[piece] = make_uint4(0, 0, 0, 0);
            }
          }
          wgmma::fence_shared_for_async();
          bars.rows.full.arrive(at_slot);
        }
      }
    } else if (warp == Tr::warps + 2) {
      // The row warp: each step's row values beside its slot's tiles.
      RowsState at_slot{};
      for (RowStep at = steps.first(); !steps.done(at); at = steps.after(at), at_slot.advance()) {
        bars.rows.acquire(at_slot);
        const int slot = at_slot.slot();
        const long long lse_offset = locate_sequence<Spec::varlen>(p, batch, at.head).lse_offset;
        for (int i = lane; i < Tr::block_m; i += 32) {
          const RowValues values = row_values(bp, lse_offset, at.r0 + i, steps.row_end);
          row_floats(slot, 0)[i] = values.lse;
          row_floats(slot, 1)[i] = values.dot;
        }
        bars.rows.full.arrive(at_slot);
      }
    } else if (Tr::staged_dq && warp == Tr::warps + 1 && !steps.done(steps.first())) {
      // The dQ warp: each staged block, added to the accumulators by one bulk reduction.
      tma::named_arrive(Bars::dq_free, Bars::dq_threads);
      for (RowStep at = steps.first(); !steps.done(at); at = steps.after(at)) {
        tma::named_sync(Bars::dq_staged, Bars::dq_threads);
        const auto add = [&] {
          // The step's rows of the sequence alone: rows past its end hold zeros, which would
          // be added to the next sequence's (or head's) rows.
          const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
          const int rows = min(Tr::block_m, seq.seqlen_q - at.r0);
          tma::reduce_add_bulk(bp.maybe_dq_accum + (seq.lse_offset + at.r0) * Spec::head_dim,
                               mma::smem_address(dq_staged), rows * Spec::head_dim * 4);
          tma::commit_bulk();
        };
        if constexpr (Spec::deterministic) {
          add_in_turn<Tr>(bp, tile, steps, at, lane, add);
        } else if (lane == 0) {
          add();
          tma::wait_bulk_read<0>();
        }
        __syncwarp();
        if (!steps.done(steps.after(at))) tma::named_arrive(Bars::dq_free, Bars::dq_threads);
      }
      if (lane == 0) tma::wait_bulk<0>();
    }
    return;
  }

  // The consumers.
  tma::claim_registers<Tr::consumer_registers>();
  const int warpgroup = warp / 4;
  // One of the two kinds has a single group (BackwardWgmmaTraits).
  const int key_group = Tr::column_groups == 1 ? warpgroup : 0;
  const int column_group = Tr::column_groups == 1 ? 0 : warpgroup;
  const auto kv = sequence_kv<Spec, T>(p, first);
  load_tile_swizzled<Tr::block_n, Tr::head_dim, Tr::qk_dim, Tr::consumer_threads>(
      k_tile, kv.k + key0 * p.kv.k_seq_stride, p.kv.k_seq_stride, first.seqlen_k - key0, thread);
  load_tile_swizzled<Tr::block_n, Tr::head_dim_v, Tr::v_dim, Tr::consumer_threads>(
      v_tile, kv.v + key0 * p.kv.v_seq_stride, p.kv.v_seq_stride, first.seqlen_k - key0, thread);
  mma::cp_async_commit();
  mma::cp_async_wait<0>();
  wgmma::fence_shared_for_async();
  tma::named_sync(Bars::kv_loaded, Tr::consumer_threads);

  // The warp's 16 keys of its key group's 64: this thread's are key_row and key_row + 8.
  const int warp_row = key_group * 64 + (warp % 4) * 16;
  const int key_row = key0 + warp_row + lane / 4;
  const unsigned k_rows = k_tile + key_group * 64 * 128;
  const unsigned v_rows = v_tile + key_group * 64 * 128;
  // This warpgroup's first query of a step's S^T and dP^T.
  const int query0 = column_group * Tr::score_cols;
  // The first 64-column chunks of this warpgroup's columns of dK and dV in a slot's Q and dO.
  const unsigned q_chunk = column_group * (Tr::qk_cols / 64) * Tr::block_m * 128;
  const unsigned dout_chunk = column_group * (Tr::v_cols / 64) * Tr::block_m * 128;
  // dQ's share of this warpgroup: rows dq_row0 of a step, columns from dq_col0.
  const int dq_m_tile = warpgroup % Tr::dq_m_tiles;
  const int dq_row0 = dq_m_tile * 64 + (warp % 4) * 16;
  const int dq_col0 = warpgroup / Tr::dq_m_tiles * Tr::dq_cols;
  const unsigned long long k_desc =
      wgmma::descriptor(k_tile + dq_col0 / 64 * Tr::block_n * 128, Tr::block_n * 128, 1024);

  float dk[1][Tr::qk_cols / 8][4];
  float dv[1][Tr::v_cols / 8][4];
  zero_fragments(dk);
  zero_fragments(dv);
  RowsState at_slot{};
  for (RowStep at = steps.first(); !steps.done(at); at = steps.after(at), at_slot.advance()) {
    const int slot = at_slot.slot();
    bars.rows.full.wait(at_slot);
    const unsigned q_tile = mma::smem_address(slot_tile(slot));
    const unsigned dout_tile = q_tile + Tr::q_bytes;
    float s[1][Tr::s_tiles][4];
    float dp[1][Tr::s_tiles][4];
    // Two groups: the probabilities are computed while dP^T's products run.
    start_kmajor_product<T, Tr::qk_dim, Tr::block_n, Tr::score_cols, Tr::block_m>(
        all_columns(s), k_rows, q_tile + query0 * 128);
    start_kmajor_product<T, Tr::v_dim, Tr::block_n, Tr::score_cols, Tr::block_m>(
        all_columns(dp), v_rows, dout_tile + query0 * 128);
    wgmma::wait<1>();
    pin_columns(s);

    const int r0 = at.r0;
    const Sequence seq = locate_sequence<Spec::varlen>(p, batch, at.head);
    const auto transform = make_logit_transform<Spec, mma::ApproxMath, 1>(p, seq, band, r0);
    const float* const lse = row_floats(slot, 0) + query0;
    const float* const dot = row_floats(slot, 1) + query0;
    const int rows_end = min(r0 + Tr::block_m, steps.row_end);
    const bool masked = !tile_in_band(band, r0, rows_end, key0, Tr::block_n);
    const bool edge = r0 + Tr::block_m > seq.seqlen_q || key0 + Tr::block_n > seq.seqlen_k;
    const int query_col = r0 + query0 + 2 * (lane % 4);
    float grad[1][Tr::s_tiles][4];
    transposed_derivatives(grad, s, transform, key_row, query_col);
    if (transform.has_bias && edge) {
      transposed_logits<true>(s, transform, key_row, query_col);
    } else {
      transposed_logits<false>(s, transform, key_row, query_col);
    }
    if (masked) mask_transposed(s, band, key_row, query_col);
    logits_to_probs(s, transform.to_log2(),
                    [&](int nt, int e) { return lse[fragment_col(nt, e, lane)]; });
    wgmma::wait<0>();
    pin_columns(dp);
    const auto query_dot = [&](int nt, int e) { return dot[fragment_col(nt, e, lane)]; };
    if constexpr (Spec::has_dbias) {
      store_transposed_dlogits(dbias_accum_rows(bp, batch, at.head), p.seqlen_k, s, dp, query_dot,
                               key_row, tile.stored, query_col, rows_end);
    }
    dp_to_ds(dp, s, grad, transform, query_dot);

    // dV += P^T dO, while dS^T goes to shared memory for dQ (with shared_probs, P^T and dS^T
    // both go there first).
    unsigned a[Tr::score_cols / 16][4];
#pragma unroll
    for (int kk = 0; kk < Tr::score_cols / 16; ++kk) probability_fragment<T>(a[kk], s, kk);
    if constexpr (!Tr::shared_probs) {
      start_nmajor_product<T, Tr::block_m, Tr::v_cols>(all_columns(dv), a, dout_tile + dout_chunk);
    }
    unsigned b[Tr::score_cols / 16][4];
#pragma unroll
    for (int kk = 0; kk < Tr::score_cols / 16; ++kk) probability_fragment<T>(b[kk], dp, kk);
    // From the packed fragments, so that the fp32 S and dS die here: b[kk][x] holds row
    // lane / 4 + 8 (x % 2), columns query0 + 16 kk + 8 (x / 2) + 2 (lane % 4) and the next, whose
    // 16-byte piece p = query0 / 8 + 2 kk + x / 2 lies in chunk p / 8 at piece (p % 8) ^
    // (lane / 4) of the row (swizzled_offset). The row's address and the lane's xor are made
    // opaque here, so that the addresses are not kept in registers across the loop.
    const auto store_transposed = [&](unsigned tile,
                                      const unsigned(&frags)[Tr::score_cols / 16][4]) {
      const unsigned row = mma::opaque(tile + (warp_row + lane / 4) * 128 + (lane % 4) * 4);
      const unsigned lane_xor = mma::opaque(static_cast<unsigned>(lane / 4) * 16);
#pragma unroll
      for (int kk = 0; kk < Tr::score_cols / 16; ++kk) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
          const unsigned piece = query0 / 8 + 2 * kk + x / 2;
          const unsigned at = row + (piece / 8) * Tr::block_n * 128 + (x % 2) * 8 * 128 +
                              (((piece % 8) * 16) ^ lane_xor);
          *reinterpret_cast<unsigned*>(base + (at - k_tile)) = frags[kk][x];
        }
      }
    };
    const int buffer = at_slot.count % 2;
    const unsigned ds = ds_tile(buffer);
    store_transposed(ds, b);
    if constexpr (Tr::shared_probs) store_transposed(ds_tile(buffer, true), a);
    wgmma::fence_shared_for_async();
    tma::named_sync(Bars::ds_stored, Tr::consumer_threads);

    // dQ (block_m x qk_dim) = dS K: this warpgroup's 64 rows and dq_cols columns, dS read
    // transposed (M-major) from the dS^T tile, K N-major; then dK += dS^T Q (with shared_probs
    // after dV += P^T dO), which runs while dQ is staged.
    float dq[Tr::dq_cols / 2];
    wgmma::fence();
    {
      const unsigned long long ds_desc =
          wgmma::descriptor(ds + dq_m_tile * Tr::block_n * 128, Tr::block_n * 128, 1024);
#pragma unroll
      for (int kk = 0; kk < Tr::block_n / 16; ++kk) {
        wgmma::mma_ss<T, true, Tr::dq_cols, true>(dq, wgmma::advance(ds_desc, kk * 16 * 128),
                                                  wgmma::advance(k_desc, kk * 16 * 128), kk > 0);
      }
    }
    wgmma::commit();
    if constexpr (Tr::shared_probs) {
      start_nmajor_product<T, Tr::block_m, Tr::v_cols>(all_columns(dv), ds_tile(buffer, true),
                                                       dout_tile + dout_chunk);
      start_nmajor_product<T, Tr::block_m, Tr::qk_cols>(all_columns(dk), ds, q_tile + q_chunk);
      wgmma::wait<2>();  // dQ
    } else {
      start_nmajor_product<T, Tr::block_m, Tr::qk_cols>(all_columns(dk), b, q_tile + q_chunk);
      wgmma::wait<1>();  // dV and dQ
    }
    wgmma::pin(dq);
    if constexpr (Tr::staged_dq) {
      tma::named_sync(Bars::dq_free, Bars::dq_threads);
      stage_dq<Tr, Tr::dq_cols>(dq_staged, dq, seq.lse_offset + r0, dq_row0, dq_col0, lane);
      wgmma::fence_shared_for_async();
      tma::named_arrive(Bars::dq_staged, Bars::dq_threads);
    } else {
      add_dq<Tr, Tr::dq_cols>(bp.maybe_dq_accum, dq, seq.lse_offset + r0, seq.seqlen_q - r0,
                              dq_row0, dq_col0, lane);
    }
    wgmma::wait<0>();
    pin_columns(dv);
    pin_columns(dk);
    bars.rows.empty.arrive(at_slot);  // this thread is done with the slot
  }

  // Every consumer is done with K and V, whose memory the gradients are staged in.
  tma::named_sync(Bars::kv_loaded, Tr::consumer_threads);
  T* const staged_k = reinterpret_cast<T*>(base);
  T* const staged_v = staged_k + Tr::block_n * Tr::qk_pitch;
  stage_fragments<Tr::qk_pitch>(staged_k, dk, warp_row, column_group * Tr::qk_cols, lane);
  stage_fragments<Tr::v_pitch>(staged_v, dv, warp_row, column_group * Tr::v_cols, lane);
  tma::named_sync(Bars::kv_loaded, Tr::consumer_threads);
  const auto grads = grad_rows<Spec::varlen, T>(bp, batch, tile.head_kv);
  store_tile<Tr::block_n, Tr::head_dim, Tr::qk_pitch, Tr::consumer_threads>(
      grads.k + key0 * grads.k_seq_stride, grads.k_seq_stride, staged_k, tile.stored - key0,
      thread);
  store_tile<Tr::block_n, Tr::head_dim_v, Tr::v_pitch, Tr::consumer_threads>(
      grads.v + key0 * grads.v_seq_stride, grads.v_seq_stride, staged_v, tile.stored - key0,
      thread);
}

// dq = the fp32 accumulators of block_m query rows, in q's dtype.
template <class Spec>
__global__ void __launch_bounds__(attention::BackwardWgmmaAccum<Spec>::threads)
    attention_backward_dq_wgmma(const KILN_GRID_CONSTANT AttentionBackwardParams bp) {
  using namespace attention;
  using Tr = BackwardWgmmaAccum<Spec>;
  using T = typename HeadTraits<Spec>::Q;
  constexpr int kChunks = Spec::head_dim / 8;
  const AttentionParams& p = bp.fwd;
  const int batch = static_cast<int>(blockIdx.z);
  const int head = static_cast<int>(blockIdx.y);
  const Sequence seq = locate_sequence<Spec::varlen>(p, batch, head);
  const int row0 = static_cast<int>(blockIdx.x) * static_cast<int>(Spec::block_m);
  T* const dq = static_cast<T*>(bp.dq) + dq_offset<Spec::varlen>(bp, batch, head);
  for (int i = static_cast<int>(threadIdx.x); i < Spec::block_m * kChunks; i += Tr::threads) {
    const int row = row0 + i / kChunks;
    if (row >= seq.seqlen_q) break;
    const int col = i % kChunks * 8;
    const long long accum_row = seq.lse_offset + row;
    // Both of the chunk's pieces: an even piece's rotation is even, so they stay together.
    const int piece = (col / 4 + dq_accum_rotation<Tr>(accum_row)) % Tr::dq_pieces;
    float x[8];
    load_chunk(x, bp.maybe_dq_accum + accum_row * Spec::head_dim + piece * 4);
    store_chunk(dq + row * bp.dq_seq_stride + col, x);
  }
}

}  // namespace kiln
