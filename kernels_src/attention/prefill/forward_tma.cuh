// SPDX-License-Identifier: Apache-2.0
// Forward attention on Hopper (sm_90a), warp-specialized: a producer warp streams Q, K and V
// tiles with TMA (cp.async.bulk.tensor) into the 128-byte-swizzled layout wgmma reads, signalling
// shared-memory mbarriers; block_m / 64 consumer warpgroups compute as forward_wgmma.cuh does,
// each on 64 query rows, and hand each K/V slot back through an mbarrier when done with it. No
// CTA-wide barrier in the key loop. The grid is persistent, a CTA per SM taking tile after tile
// (common/tile_scheduler.cuh, in the order of tma/tile_order.cuh), so that a tile's loads run
// under the last one's products. Where shared memory has room for an output staging tile
// (attention_forward_tma_staged: head dims up to 128) a tile's output leaves by bulk copies under
// the next one's products; otherwise each thread stores its accumulators. The producer
// warpgroup hands registers back (setmaxnreg) to the consumers.
//
// fp8 k and v (e4m3, e5m2) under a 16-bit q land in staging entries instead, which the producer
// warpgroup's other three warps widen into the slots (tma/converter.cuh): P V reads q's type
// either way. Q K^T too, but under a bf16 q over e4m3 k and v, whose K lands in its slots as e4m3
// and whose q each consumer warpgroup splits into two e4m3 terms once its tile lands
// (tma/q_terms.cuh): fp8 products, hi's and lo's, with no widening of K (splits_q). With fp8 q, k
// and v (e4m3) the products are fp8 ones (k32 steps) over 128-byte chunks of 128 columns
// (64-byte ones of 64 at head dims to 64): Q and K land as 16-bit ones do, V in a staging entry
// that those warps transpose into its slot (wgmma's fp8 operands are K-major); P is rounded to
// e4m3 from 2^8 (OnlineSoftmax's Offset) and each block's P V is added into fp32 accumulators
// once it is in: under the next block's scores, or up to head dim 128 with 256 keys a block (and
// past 128) after the block's softmax, in the scores' registers.
//
// Its parts, in attention/prefill/tma/: traits.cuh (shapes, registers, the barriers, on
// common/pipeline.cuh), producer.cuh (the loads), converter.cuh (fp8 k and v), q_terms.cuh (a
// split q), epilogue.cuh (output and LSE stores) and tile_order.cuh. The consumers' key loop stays
// in the kernel's body: moved into a member function of its own, the same statements came out of
// ptxas scheduled differently and ran 2-7% slower at head dims 128 and 256 on an H200
// (bench/RESULTS.md, run 24a).
//
// Spec constants: those of attention_forward_wgmma (block_m, block_n, stages). With two consumer
// warpgroups (block_m 128) they take turns at the tensor cores (ping-pong, below);
// with three (192) the scheduler interleaves them.
//
// Keys past a sequence's end get probability 0, and their V rows are zeros whatever memory holds
// there: TMA reads zeros past the tensor's token dim, and the producer (with fp8, the converters)
// zeroes the rest of the block that holds a sequence's last key (a varlen neighbour's rows, or
// rows past seqused_k).
//
// Launch: grid (x) at most one CTA per SM, and at most the tile count, ceil(seqlen_q / block_m) *
// heads * batch; block (block_m / 64 + 1) * 128 threads; dynamic shared memory
// attention_forward_tma_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages, q_size,
// kv_size, out_size); the argument is an AttentionTmaParams whose tensor maps have boxes of 64
// columns (128 bytes; with fp8 q, 128 columns, and q's and k's 64 at head dims to 64) by block_m
// (q) and block_n (k, v) rows.
#pragma once

#include "attention/prefill/tma/converter.cuh"
#include "attention/prefill/tma/epilogue.cuh"
#include "attention/prefill/tma/producer.cuh"
#include "attention/prefill/tma/q_terms.cuh"

namespace kiln {

// The kernel, as its roles: the barriers set up, then the producer warp's loads
// (tma/producer.cuh), with fp8 k and v the converters' widening (tma/converter.cuh), or each
// consumer warpgroup's tiles, every one through the key loop and the epilogue (tma/epilogue.cuh).
template <class Spec>
__global__ void __launch_bounds__(attention::TmaTraits<Spec>::threads, 1)
    attention_forward_tma(const KILN_GRID_CONSTANT AttentionTmaParams tp) {
  using namespace attention;
  using Tr = TmaTraits<Spec>;
  const AttentionParams& p = tp.p;

  extern __shared__ __align__(1024) unsigned char tma_smem[];
  __shared__ TmaBarriers<Tr> bars;
  static_assert(sizeof(TmaBarriers<Tr>) <= 1024,
                "the barriers outgrow the 1 KiB attention_forward_tma_budget_bytes leaves them.");
  unsigned char* const tiles = tma_smem + (1024 - mma::smem_address(tma_smem) % 1024) % 1024;

  const int thread = threadIdx.x;
  if (thread == 0) bars.init();
  __syncthreads();
  const TileOrder<Spec, Tr::block_m, Tr::block_n> order{p, tp.section_pairs};

  if (thread >= Tr::consumer_threads) {
    // The producer: the first warp of the last warpgroup; with fp8 k and v, the other three
    // convert.
    tma::release_registers<Tr::producer_registers>();
    const int role_thread = thread - Tr::consumer_threads;
    if (role_thread < 32) {
      TmaProducer<Spec>(tp, bars, tiles, thread % 32).run(order);
    } else if constexpr (Tr::kv_fp8) {
      TmaConverter<Spec>{bars, tiles, role_thread - 32}.run();
    }
    return;
  }

  // The consumers. The i-th K/V block they take is in slot i % stages and completes phase
  // (i / stages) & 1 of its barriers (common/pipeline.cuh).
  const auto phase = [](int i) { return static_cast<unsigned>(i / Tr::stages) & 1; };
  tma::claim_registers<Tr::consumer_registers>();
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int warpgroup = warp / 4;
  // This warpgroup's 64 rows of Q (split, of its two terms); 8-row groups are 8 rows of a chunk
  // (1024 bytes, or 512 in 64-byte chunks) apart in every chunk.
  const unsigned q_tile = mma::smem_address(tiles);
  const unsigned kv_base = q_tile + Tr::q_bytes;
  const unsigned q_rows = q_tile + warpgroup * 64 * Tr::q_chunk_bytes;
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
    tma::wait(&bars.q.full.barrier[0], q_count & 1);
    const int index = *static_cast<volatile int*>(&bars.q_tile_index);
    if (index < 0) break;
    const Tile tile = order.tile(index);
    const Sequence& seq = tile.seq;
    const RowBlock& rows = tile.rows;
    const KeyBlocks& blocks = tile.blocks;
    const Band& band = tile.band;
    const int row0 = rows.begin + warp * Tr::rows_per_warp + lane / 4;
    const int turns = blocks.end - blocks.begin;
    // A split q's terms, before any scores (and before Q's slot goes back, with no key blocks),
    // and the power of two they were scaled by.
    float q_factor = 1.f;
    if constexpr (Tr::splits_q) {
      if (turns > 0) {
        q_factor =
            QTerms<Tr>{tiles, bars.q_amax.warp + 4 * warpgroup, warpgroup, thread % 128}.split(
                4 + warpgroup);
      }
    }
    const auto transform = [&] {
      auto f = make_logit_transform<Spec, mma::ApproxMath, 2>(p, seq, band, row0);
      if constexpr (Tr::q_fp8) f.scale *= q_descale(tp, seq);
      if constexpr (Tr::splits_q) f.scale *= q_factor;
      return f;
    }();
    const float to_log2 = transform.to_log2();

    float o[1][Tr::o_tiles][4];
    zero_fragments(o);
    // fp8 products: each block's P V, added into o once it is in (add_output).
    float pv[1][Tr::o_tiles][4];
    // Where o is large enough for the rescale vote, a running max that lags the rows' logits by
    // up to 2^8 leaves most steps no rescale. Measured on an H100: 6% faster at head dim 256;
    // at 64, voting on every step as well, 7-9% slower. Not under fp8 P, whose probabilities
    // count from 2^8 already (Tr::p_offset) and would saturate e4m3.
    constexpr int slack = OnlineSoftmax<1>::votes<Tr::o_tiles> && !Tr::q_fp8 ? 8 : 0;
    OnlineSoftmax<1, 128, slack, Tr::p_offset> softmax;
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
      if constexpr (Tr::q_fp8) pin_columns(pv);
      release(&bars.v.empty.barrier[slot]);
    };

    // Block j's scores are computed while block j - 1's probabilities multiply V, and its
    // softmax runs under that product; o is rescaled once the product is in. Q's slot goes back
    // once the last scores are in.
    if (turns == 0) tma::arrive(&bars.q.empty.barrier[0]);
    if constexpr (Tr::split_pv) {
      // fp8 products past 128 columns of V or 128 keys: a block's P V once its softmax is done
      // (the other warpgroup's products run under that softmax), 128 columns at a time into the
      // scores' registers, each added into o once it is in.
      float s[1][Tr::s_tiles][4];
      ProbabilityFragments<Tr> a;
      for (int turn = 0; turn < turns; ++turn) {
        const int slot = (kv_count + turn) % Tr::stages;
        tma::wait(&bars.k.full.barrier[slot], phase(kv_count + turn));
        take_turn();
        start_scores<Tr>(s, q_rows, k_tile(slot));
        pass_turn();
        wgmma::wait<0>();
        release(&bars.k.empty.barrier[slot]);
        if (turn + 1 == turns) tma::arrive(&bars.q.empty.barrier[0]);
        transform_logits(s, blocks.begin + turn);
        softmax.update(s, o, to_log2);
        probability_fragments<Tr>(a, s);
        tma::wait(&bars.v.full.barrier[slot], phase(kv_count + turn));
#pragma unroll
        for (int part = 0; part < Tr::pv_parts; ++part) {
          start_output_columns<Tr>(s, a, k_tile(slot) + Tr::k_bytes, part);
          wgmma::wait<0>();
          pin_columns(s);
          add_columns<Tr>(o, s, part);
        }
        release(&bars.v.empty.barrier[slot]);
      }
      kv_count += turns;
    } else if (turns > 0) {
      float s[1][Tr::s_tiles][4];
      ProbabilityFragments<Tr> a;
      // P V into o, or with fp8 products into pv.
      const auto start_product = [&](int slot) {
        if constexpr (Tr::q_fp8) {
          start_output<Tr>(pv, a, k_tile(slot) + Tr::k_bytes);
        } else {
          start_output<Tr>(o, a, k_tile(slot) + Tr::k_bytes);
        }
      };
      int slot = kv_count % Tr::stages;
      tma::wait(&bars.k.full.barrier[slot], phase(kv_count));
      take_turn();
      start_scores<Tr>(s, q_rows, k_tile(slot));
      pass_turn();
      wgmma::wait<0>();
      release(&bars.k.empty.barrier[slot]);
      if (turns == 1) tma::arrive(&bars.q.empty.barrier[0]);
      transform_logits(s, blocks.begin);
      softmax.update(s, o, to_log2);
      probability_fragments<Tr>(a, s);
      for (int turn = 1; turn < turns; ++turn) {
        const int next = (kv_count + turn) % Tr::stages;
        tma::wait(&bars.k.full.barrier[next], phase(kv_count + turn));
        tma::wait(&bars.v.full.barrier[slot], phase(kv_count + turn - 1));
        take_turn();
        start_scores<Tr>(s, q_rows, k_tile(next));
        start_product(slot);
        pass_turn();
        wgmma::wait<1>();
        release(&bars.k.empty.barrier[next]);
        if (turn + 1 == turns) tma::arrive(&bars.q.empty.barrier[0]);
        transform_logits(s, blocks.begin + turn);
        float rescale[2];
        softmax.exponentiate(s, to_log2, rescale);
        output_done(slot);
        if constexpr (Tr::q_fp8) {
          add_output(o, pv, rescale);
        } else {
          softmax.rescale_output(o, rescale);
        }
        probability_fragments<Tr>(a, s);
        slot = next;
      }
      tma::wait(&bars.v.full.barrier[slot], phase(kv_count + turns - 1));
      start_product(slot);
      output_done(slot);
      if constexpr (Tr::q_fp8) add_output(o, pv, {1.f, 1.f});
      kv_count += turns;
    }

    const TmaEpilogue<Spec> epilogue{p, tiles, warp, lane};
    epilogue.store(o, softmax, tile, transform, to_log2, row0);
  }
  if (ping_pong && warpgroup == 0) take_turn();
  TmaEpilogue<Spec>::finish();
}

}  // namespace kiln
