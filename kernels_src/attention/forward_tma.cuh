// Forward attention on Hopper (sm_90a), warp-specialized: a producer warp streams Q, K and V
// tiles with TMA (cp.async.bulk.tensor) into the 128-byte-swizzled layout wgmma reads, signalling
// shared-memory mbarriers; block_m / 64 consumer warpgroups compute as forward_wgmma.cuh does,
// each on 64 query rows, and hand each K/V slot back through an mbarrier when done with it. No
// CTA-wide barrier in the key loop. The producer warpgroup hands registers back (setmaxnreg), but
// ptxas still holds the consumers' code to the 168 registers a 384-thread CTA gets per thread:
// at head dim 256 the 64 x 256 accumulator takes 128 of them and a little spills.
//
// Spec constants: those of attention_forward_wgmma (block_m 64 or 128 here, block_n, stages).
//
// Keys past a sequence's end get probability 0, and their V rows are zeros whatever memory holds
// there: TMA reads zeros past the tensor's token dim, and the producer zeroes the rest of the
// block that holds a sequence's last key (a varlen neighbour's rows, or rows past seqused_k).
//
// Launch: grid as attention_forward; block (block_m / 64 + 1) * 128 threads; dynamic shared
// memory attention_forward_wgmma_smem_bytes(head_dim, head_dim_v, block_m, block_n, stages);
// the argument is an AttentionTmaParams whose tensor maps have boxes of 64 columns by block_m
// (q) and block_n (k, v) rows.
#pragma once

#include "attention/forward_wgmma.cuh"
#include "common/tma.cuh"

namespace kiln {
namespace attention {

template <class Spec>
struct TmaTraits : WgmmaTraits<Spec> {
  using Base = WgmmaTraits<Spec>;
  static_assert(Base::block_m == 64 || Base::block_m == 128,
                "block_m must be 64 or 128: one consumer warpgroup per 64 query rows.");
  static constexpr int consumer_groups = Base::block_m / 64;
  static constexpr int consumer_threads = consumer_groups * 128;
  static constexpr int threads = consumer_threads + 128;  // and the producer warpgroup
  // setmaxnreg counts: the producer keeps what issuing copies needs, the consumers take what
  // the 64K-register file has left, at most 240 (multiples of 8).
  static constexpr int producer_registers = 24;
  static constexpr int consumer_registers = 240;
  static_assert(producer_registers * 128 + consumer_registers * consumer_threads <= 65536,
                "the warpgroups' registers do not fit the register file.");
};

}  // namespace attention

template <class Spec>
__global__ void __launch_bounds__(attention::TmaTraits<Spec>::threads, 1)
    attention_forward_tma(const KILN_GRID_CONSTANT AttentionTmaParams tp) {
  using namespace attention;
  using Tr = TmaTraits<Spec>;
  using T = typename Tr::T;
  const AttentionParams& p = tp.p;

  extern __shared__ __align__(1024) unsigned char tma_smem[];
  __shared__ unsigned long long q_full;
  // K and V of a slot have barriers of their own: a warpgroup is done with K once its scores are
  // in, well before it is done with V, and the next K load need not wait for V.
  __shared__ unsigned long long k_full[Tr::stages], k_empty[Tr::stages];
  __shared__ unsigned long long v_full[Tr::stages], v_empty[Tr::stages];
  // The V block that holds the sequence's last key lands here instead: its rows past that key
  // are zeroed before v_full is signalled (see the producer).
  __shared__ unsigned long long v_tail;
  unsigned char* const tiles = tma_smem + (1024 - mma::smem_address(tma_smem) % 1024) % 1024;
  const unsigned q_tile = mma::smem_address(tiles);
  const unsigned kv_base = q_tile + Tr::q_bytes;

  const Sequence seq = locate_sequence<Spec::varlen>(p, blockIdx.z, blockIdx.y);
  const RowBlock rows = cta_row_block<Tr::block_m>(seq);
  if (rows.begin >= rows.end) return;
  const Band band = make_band<Spec::band>(p.score, seq.seqlen_q, seq.seqlen_k);
  const KeyBlocks blocks = key_blocks(band, rows.begin, rows.end, Tr::block_n);

  const int thread = threadIdx.x;
  if (thread == 0) {
    tma::init(&q_full, 1);
    tma::init(&v_tail, 1);
#pragma unroll
    for (int s = 0; s < Tr::stages; ++s) {
      tma::init(&k_full[s], 1);
      tma::init(&v_full[s], 1);
      tma::init(&k_empty[s], Tr::consumer_threads / 32);  // one arrival per consumer warp
      tma::init(&v_empty[s], Tr::consumer_threads / 32);
    }
    tma::fence_init();
  }
  __syncthreads();

  if (thread >= Tr::consumer_threads) {
    // The producer: the first warp of the last warpgroup; its first lane issues every copy.
    tma::release_registers<Tr::producer_registers>();
    if (thread >= Tr::consumer_threads + 32) return;
    const int lane = thread % 32;
    const bool issuer = lane == 0;
    if (issuer) {
      tma::prefetch_map(&tp.q_map);
      tma::prefetch_map(&tp.k_map);
      tma::prefetch_map(&tp.v_map);
    }
    const int head_kv = seq.head / (p.heads / p.heads_kv);
    const int q_token = (Spec::varlen ? p.maybe_cu_seqlens_q[seq.batch] : 0) + rows.begin;
    const int k_token = Spec::varlen ? p.maybe_cu_seqlens_k[seq.batch] : 0;
    const int batch = Spec::varlen ? 0 : seq.batch;
    if (issuer) {
      tma::arrive_expect_tx(&q_full, Tr::q_bytes);
#pragma unroll
      for (int c = 0; c < Tr::qk_dim / 64; ++c) {
        tma::load_4d(tiles + c * Tr::block_m * 128, &tp.q_map, &q_full, 64 * c, q_token, seq.head,
                     batch);
      }
    }
    for (int block = blocks.begin, i = 0; block < blocks.end; ++block, ++i) {
      const int slot = i % Tr::stages;
      const unsigned reuse = (i / Tr::stages - 1) & 1;  // the phase that frees the slot
      unsigned char* const k_tile = tiles + Tr::q_bytes + slot * Tr::slot_bytes;
      unsigned char* const v_tile = k_tile + Tr::k_bytes;
      const int key = k_token + block * Tr::block_n;
      if (issuer) {
        if (i >= Tr::stages) tma::wait(&k_empty[slot], reuse);
        tma::arrive_expect_tx(&k_full[slot], Tr::k_bytes);
#pragma unroll
        for (int c = 0; c < Tr::qk_dim / 64; ++c) {
          tma::load_4d(k_tile + c * Tr::block_n * 128, &tp.k_map, &k_full[slot], 64 * c, key,
                       head_kv, batch);
        }
        if (i >= Tr::stages) tma::wait(&v_empty[slot], reuse);
      }
      // Keys past the sequence's end get probability 0, but 0 times a NaN or infinity in their V
      // rows (another sequence's, or memory the caller never wrote) is NaN: the block holding
      // the last key is zeroed past it, as the wgmma kernel's loads do, before the consumers
      // see it. (K needs nothing: masking replaces those logits whatever they are.)
      const int valid = seq.seqlen_k - block * Tr::block_n;
      const bool tail = valid < Tr::block_n;
      unsigned long long* const landed = tail ? &v_tail : &v_full[slot];
      if (issuer) {
        tma::arrive_expect_tx(landed, Tr::slot_bytes - Tr::k_bytes);
#pragma unroll
        for (int c = 0; c < Tr::v_dim / 64; ++c) {
          tma::load_4d(v_tile + c * Tr::block_n * 128, &tp.v_map, landed, 64 * c, key, head_kv,
                       batch);
        }
      }
      if (tail) {
        // At most one block of a CTA holds the sequence's end: v_tail's first phase.
        tma::wait(&v_tail, 0);
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
      }
    }
    return;
  }

  // The consumers.
  tma::claim_registers<Tr::consumer_registers>();
  const int warp = thread / 32;
  const int lane = thread % 32;
  const int warpgroup = warp / 4;
  const LogitTransform<Spec, mma::ApproxMath> transform =
      make_logit_transform<Spec, mma::ApproxMath>(p, seq, band);
  const float to_log2 = transform.to_log2();
  const int row0 = rows.begin + warp * Tr::rows_per_warp + lane / 4;

  float o[1][Tr::o_tiles][4];
  zero_columns(o);
  OnlineSoftmax<1> softmax;
  softmax.init();

  // This warpgroup's 64 rows of Q; 8-row groups are 1024 bytes apart in every chunk.
  const unsigned q_rows = q_tile + warpgroup * 64 * 128;
  const auto k_tile = [&](int slot) { return kv_base + slot * Tr::slot_bytes; };
  const auto transform_logits = [&](float(&s)[1][Tr::s_tiles][4], int block) {
    pin_columns(s);
    const int key0 = block * Tr::block_n + 2 * (lane % 4);
    transform.apply(s, row0, key0);
    if (blocks.needs_mask(block, Tr::block_n)) mask_logits(s, band, row0, key0);
  };
  // This warp is done with a slot's K or V.
  const auto release = [&](unsigned long long* empty) {
    __syncwarp();
    if (lane == 0) tma::arrive(empty);
  };
  const auto output_done = [&](int slot) {
    wgmma::wait<0>();
    pin_columns(o);
    release(&v_empty[slot]);
  };

  // Ping-pong: with two consumer warpgroups, each issues its products only in its turn and then
  // passes the turn on, so that one's softmax runs while the other's products keep the tensor
  // cores busy. Named barrier 2 + g is warpgroup g's turn: its 128 threads sync on it, the
  // other's 128 arrive. The second warpgroup hands the first its first turn, and skips its last
  // hand-off, so that every barrier sees as many arrivals as syncs.
  constexpr bool ping_pong = Tr::consumer_groups == 2;
  const int turns = blocks.end - blocks.begin;
  const auto take_turn = [&] {
    if constexpr (ping_pong) tma::named_sync(2 + warpgroup, 256);
  };
  const auto pass_turn = [&](int turn) {
    if constexpr (ping_pong) {
      if (warpgroup == 0 || turn + 1 < turns) tma::named_arrive(3 - warpgroup, 256);
    }
  };
  if (ping_pong && warpgroup == 1 && turns > 0) tma::named_arrive(2, 256);

  // Block j's scores are computed while block j - 1's probabilities multiply V, and its softmax
  // runs under that product; o is rescaled once the product is in.
  tma::wait(&q_full, 0);
  if (blocks.begin < blocks.end) {
    float s[1][Tr::s_tiles][4];
    unsigned a[Tr::block_n / 16][4];
    tma::wait(&k_full[0], 0);
    take_turn();
    start_scores<Tr>(s, q_rows, k_tile(0));
    pass_turn(0);
    wgmma::wait<0>();
    release(&k_empty[0]);
    transform_logits(s, blocks.begin);
    softmax.update(s, o, to_log2);
    probability_fragments<Tr>(a, s);
    int slot = 0;
    for (int block = blocks.begin + 1, i = 1; block < blocks.end; ++block, ++i) {
      const int next = i % Tr::stages;
      tma::wait(&k_full[next], (i / Tr::stages) & 1);
      tma::wait(&v_full[slot], ((i - 1) / Tr::stages) & 1);
      take_turn();
      start_scores<Tr>(s, q_rows, k_tile(next));
      start_output<Tr>(o, a, k_tile(slot) + Tr::k_bytes);
      pass_turn(i);
      wgmma::wait<1>();
      release(&k_empty[next]);
      transform_logits(s, block);
      float rescale[2];
      softmax.exponentiate(s, to_log2, rescale);
      output_done(slot);
      softmax.rescale_output(o, rescale);
      probability_fragments<Tr>(a, s);
      slot = next;
    }
    tma::wait(&v_full[slot], ((turns - 1) / Tr::stages) & 1);
    start_output<Tr>(o, a, k_tile(slot) + Tr::k_bytes);
    output_done(slot);
  }

  float lse[2];
  softmax.finish(o, to_log2, lse);

  // Every consumer is done reading Q, K and V (and every copy has landed) before the output
  // overwrites them.
  tma::named_sync(1, Tr::consumer_threads);
  T* const staging = reinterpret_cast<T*>(tiles);
  stage_output<Tr>(staging, o, warp, lane);
  tma::named_sync(1, Tr::consumer_threads);
  T* const out = static_cast<T*>(p.out) + seq.out_offset + rows.begin * p.out_seq_stride;
  store_tile<Tr::block_m, Tr::head_dim_v, Tr::v_pitch, Tr::consumer_threads>(
      out, p.out_seq_stride, staging, rows.end - rows.begin, thread);
  if (p.maybe_lse != nullptr)
    store_lse<Tr>(p.maybe_lse + seq.lse_offset, lse, row0, seq.seqlen_q, lane);
}

}  // namespace kiln
