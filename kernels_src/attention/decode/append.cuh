// SPDX-License-Identifier: Apache-2.0
// Appends k_new / v_new to a KV cache at each sequence's length, with the optional rotary
// embedding of k_new and of q (into a contiguous copy the attention kernel then reads).
//
// Spec constants: dtype_q (kiln::f16 or kiln::bf16: q, q_rotated and the rotary tables),
// dtype_kv (the cache's: q's, whose k_new and v_new are copied, or kiln::e4m3 or kiln::e5m2,
// whose k_new and v_new are q's, quantized by the descales), head_dim, head_dim_v, paged (keys go
// through the block table), rotary (rotate k_new, and write the rotated q to q_rotated),
// token_descales (an fp8 cache with descales per (token, kv head): each new row of a kv head is
// quantized by a descale of its own, row_descale of its largest magnitude, written beside it).
//
// Launch: grid (max(seqlen_new, rotary ? seqlen_q : 0), batch), kDecodeAppendThreads (128) threads,
// no shared memory. Block (t, b) writes token t of sequence b: its heads_kv key and value rows, and
// with rotary its q rows. A tiny kernel next to the attention: plain element loops, fp32 rotation.
#pragma once

#include "attention/core/fp8.cuh"
#include "attention/core/kv_layout.cuh"
#include "common/prelude.cuh"
#include "kiln/params/decode.h"

namespace kiln {
namespace decode {

// Element c of a row x rotated at `position`: pairs (c, c + rotary_dim / 2), or (2i, 2i + 1)
// when interleaved, turn by the angle whose cos and sin are in row `position` of the tables,
// elements of Table (q's type). Elements at or past rotary_dim pass through.
template <class Table, class T>
__device__ __forceinline__ float rotate(const T* x, int c, int position, const DecodeParams& p) {
  const float value = to_float(x[c]);
  if (c >= p.rotary_dim) return value;
  const int half = p.rotary_dim / 2;
  int pair;  // index into the cos/sin row
  int other;
  bool first;
  if (p.rotary_interleaved) {
    pair = c / 2;
    first = c % 2 == 0;
    other = first ? c + 1 : c - 1;
  } else {
    first = c < half;
    pair = first ? c : c - half;
    other = first ? c + half : c - half;
  }
  const long long at = position * p.rotary_stride + pair;
  const float cosine = to_float(static_cast<const Table*>(p.maybe_rotary_cos)[at]);
  const float sine = to_float(static_cast<const Table*>(p.maybe_rotary_sin)[at]);
  const float partner = to_float(x[other]);
  return first ? value * cosine - partner * sine : value * cosine + partner * sine;
}

// A new key or value element as the cache keeps it: the element itself in a 16-bit cache; in an
// fp8 one, divided by its descale (nullptr: 1) and rounded to the nearest fp8 value, saturating
// (fp8_from_float).
template <class KV, class New>
__device__ __forceinline__ KV to_cache(New x, const float* descale) {
  if constexpr (is_same<KV, New>::value) {
    return x;
  } else {
    const float value = to_float(x);
    return attention::fp8_from_float<KV>(descale != nullptr ? __fdiv_rn(value, *descale) : value);
  }
}

// One new row of Dim elements (element c: row(c), as fp32) into an fp8 cache row `to` with a
// descale of its own, by a warp: the row's largest magnitude sets it (attention::row_descale,
// over the kv head's descale head_descale), written to *descale_to by lane 0; each element goes
// divided by head_descale times it, rounded and saturated.
template <class KV, int Dim, class Row>
__device__ __forceinline__ void append_row_descaled(KV* to, float* descale_to, float head_descale,
                                                    const Row& row, int lane) {
  constexpr int per_lane = (Dim + 31) / 32;
  float x[per_lane];
  float largest = 0.f;
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    const int c = lane + 32 * i;
    x[i] = c < Dim ? row(c) : 0.f;
    largest = fmaxf(largest, fabsf(x[i]));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, offset));
  }
  const float descale = attention::row_descale<KV>(largest, head_descale);
  const float effective = __fmul_rn(head_descale, descale);
  if (lane == 0) *descale_to = descale;
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    const int c = lane + 32 * i;
    if (c < Dim) to[c] = attention::fp8_from_float<KV>(__fdiv_rn(x[i], effective));
  }
}

}  // namespace decode

template <class Spec>
__global__ void __launch_bounds__(kDecodeAppendThreads)
    decode_append(const KILN_GRID_CONSTANT DecodeParams p) {
  using Q = typename Spec::dtype_q;
  using KV = typename Spec::dtype_kv;
  constexpr bool fp8 = is_same<KV, e4m3>::value || is_same<KV, e5m2>::value;
  using New = typename conditional<fp8, Q, KV>::type;  // of k_new and v_new
  constexpr int head_dim = static_cast<int>(Spec::head_dim);
  constexpr int head_dim_v = static_cast<int>(Spec::head_dim_v);
  const int t = blockIdx.x;
  const int batch = blockIdx.y;
  const int cached = p.seqlens[batch];

  if (t < p.seqlen_new) {
    const int position = cached + t;
    // The destination token's rows at kv head 0: the sequence's start, then the key's offset
    // from it (rows made at offset 0, so that the two sum before the pointer steps).
    constexpr attention::KVMode mode = attention::cache_mode(Spec::paged);
    const attention::KVOffsets start = attention::kv_sequence_start<mode>(p.kv, batch);
    const auto cache = attention::kv_rows_at<mode, KV>(p.kv, batch, {0, 0});
    long long k_off, v_off;
    cache.offsets(position, k_off, v_off);
    KV* const k = cache.k + (start.k + k_off);
    KV* const v = cache.v + (start.v + v_off);
    const New* const k_new = static_cast<const New*>(p.maybe_k_new) + batch * p.k_new_batch_stride +
                             t * p.k_new_seq_stride;
    const New* const v_new = static_cast<const New*>(p.maybe_v_new) + batch * p.v_new_batch_stride +
                             t * p.v_new_seq_stride;
    // An fp8 cache's descales of kv head h (null: none).
    auto descales = [&](int h) {
      return fp8 ? attention::head_descales(p.descales, batch, h) : attention::HeadDescales{};
    };
    // Key element c of kv head h as the cache takes it: rotated keys are rounded to New first,
    // as a caller rotating them would have them.
    auto key = [&](int h, int c) -> New {
      const New* const src = k_new + h * p.k_new_head_stride;
      if constexpr (Spec::rotary) {
        return from_float<New>(decode::rotate<Q>(src, c, position, p));
      } else {
        return src[c];
      }
    };
    if constexpr (Spec::token_descales) {
      static_assert(fp8, "descales per token are an fp8 cache's.");
      // A warp per kv head's row; the descales' rows lie where the cache's do.
      const auto rows = attention::kv_rows_at<mode, float>(
          p.token_descale, batch, attention::kv_sequence_start<mode>(p.token_descale, batch));
      long long kd_off, vd_off;
      rows.offsets(position, kd_off, vd_off);
      const int lane = threadIdx.x % 32;
      for (int h = threadIdx.x / 32; h < p.heads_kv; h += blockDim.x / 32) {
        const attention::HeadDescales head = descales(h);
        decode::append_row_descaled<KV, head_dim>(
            k + h * p.kv.k_head_stride, rows.k + kd_off + h * p.token_descale.k_head_stride,
            attention::descale_or_one(head.k), [&](int c) { return to_float(key(h, c)); }, lane);
        decode::append_row_descaled<KV, head_dim_v>(
            v + h * p.kv.v_head_stride, rows.v + vd_off + h * p.token_descale.v_head_stride,
            attention::descale_or_one(head.v),
            [&](int c) { return to_float(v_new[h * p.v_new_head_stride + c]); }, lane);
      }
    } else {
      for (int e = threadIdx.x; e < p.heads_kv * head_dim; e += blockDim.x) {
        const int h = e / head_dim, c = e % head_dim;
        k[h * p.kv.k_head_stride + c] = decode::to_cache<KV>(key(h, c), descales(h).k);
      }
      for (int e = threadIdx.x; e < p.heads_kv * head_dim_v; e += blockDim.x) {
        const int h = e / head_dim_v, c = e % head_dim_v;
        v[h * p.kv.v_head_stride + c] =
            decode::to_cache<KV>(v_new[h * p.v_new_head_stride + c], descales(h).v);
      }
    }
  }

  if constexpr (Spec::rotary) {
    if (t < p.seqlen_q) {
      const int position = cached + (p.rotary_q_causal ? t : 0);
      const Q* const q = static_cast<const Q*>(p.q) + batch * p.q_batch_stride + t * p.q_seq_stride;
      Q* const q_rotated = static_cast<Q*>(p.maybe_q_rotated) +
                           (static_cast<long long>(batch) * p.seqlen_q + t) * p.heads * head_dim;
      for (int e = threadIdx.x; e < p.heads * head_dim; e += blockDim.x) {
        const int h = e / head_dim, c = e % head_dim;
        q_rotated[e] = from_float<Q>(decode::rotate<Q>(q + h * p.q_head_stride, c, position, p));
      }
    }
  }
}

}  // namespace kiln
