// From q.k scores to the logits the softmax sees: the optional softcap, ALiBi and additive bias
// of a spec (each compiled only when on), then the band mask. Vendor-neutral: the tanh of the
// softcap comes from the Math the kernel passes (mma::ApproxMath or LibraryMath).
#pragma once

#include "attention/core/mask.cuh"
#include "attention/core/math.cuh"
#include "attention/core/sequence.cuh"
#include "kiln/params/attention.h"

namespace kiln::attention {

// Fragment coordinates (apply and mask_logits, for the mma kernel): thread (g = lane / 4,
// t = lane % 4) holds, for m16 tile mt and n8 tile nt, row row0 + 16 * mt + 8 * half (half 0, 1)
// and key key0 + 8 * nt + e (e 0, 1) in accumulator element 2 * half + e, where row0 is the
// warp's first row + g and key0 is the block's first key + 2 * t.

// Which of the hooks of kiln/variant.hpp a user variant V defines; each is optional.
template <class V>
struct VariantHooks {
  template <class U>
  static constexpr __device__ auto logit_of(int)
      -> decltype(U::logit(*static_cast<const VariantParams*>(nullptr),
                           *static_cast<const VariantCoords*>(nullptr), 0.f),
                  true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool logit_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto mask_of(int)
      -> decltype(static_cast<bool>(U::mask(*static_cast<const VariantParams*>(nullptr),
                                            *static_cast<const VariantCoords*>(nullptr))),
                  true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool mask_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto sink_of(int)
      -> decltype(U::sink(*static_cast<const VariantParams*>(nullptr),
                          *static_cast<const VariantCoords*>(nullptr), 0.f),
                  true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool sink_of(...) {
    return false;
  }

  static constexpr bool logit = logit_of<V>(0);
  static constexpr bool mask = mask_of<V>(0);
  static constexpr bool sink = sink_of<V>(0);
  static_assert(logit || mask || sink,
                "kiln_variant defines none of its hooks: give it a static __device__ logit(const "
                "kiln::VariantParams&, const kiln::VariantCoords&, float), mask(const "
                "kiln::VariantParams&, const kiln::VariantCoords&) or sink(const "
                "kiln::VariantParams&, const kiln::VariantCoords&, float) (kiln/variant.hpp)");
};

// A user variant's logit and mask hooks on the logit at `at`; the identity without them.
template <class Spec>
__device__ __forceinline__ float variant_logit(const VariantParams& variant,
                                               const VariantCoords& at, float logit) {
  if constexpr (Spec::has_variant) {
    using V = typename Spec::variant;
    if constexpr (VariantHooks<V>::logit) logit = V::logit(variant, at, logit);
    if constexpr (VariantHooks<V>::mask) {
      if (!V::mask(variant, at)) logit = neg_inf();
    }
  }
  return logit;
}

// The sink logit of the row at `at` (natural units; -inf: none): the call's sink for the query
// head (ScoreOptions::sinks), through the variant's sink hook when it has one. Only for real
// rows (at.query < seqlen_q), as the hook may index tensors by them; at.key is -1.
template <class Spec>
__device__ __forceinline__ float row_sink(const ScoreParams& score, const VariantCoords& at) {
  const float sink = score.maybe_sinks != nullptr ? score.maybe_sinks[at.head] : neg_inf();
  if constexpr (Spec::has_variant) {
    using V = typename Spec::variant;
    if constexpr (VariantHooks<V>::sink) return V::sink(score.variant, at, sink);
  }
  return sink;
}

template <class Spec, class Math>
struct LogitTransform {
  using T = typename Spec::dtype;
  static constexpr bool on =
      Spec::has_softcap || Spec::has_alibi || Spec::has_bias || Spec::has_variant;

  float scale;
  float softcap;
  float inv_softcap;
  float alibi_slope;
  int offset;  // of the band's diagonal, which ALiBi distances are measured from
  int seqlen_q;
  int seqlen_k;
  const T* bias;  // at (batch, head)
  long long bias_row_stride;
  long long bias_col_stride;
  const VariantParams* variant;
  VariantCoords sequence;  // batch, head and kv head (query and key vary)

  // Logits times this are in log2 units. Without transforms the logits stay raw scores and
  // the softmax scale rides along here, saving a multiply per score.
  __device__ __forceinline__ float to_log2() const { return on ? kLog2e : scale * kLog2e; }

  template <int MTiles, int STiles>
  __device__ __forceinline__ void apply(float (&s)[MTiles][STiles][4], int row0, int key0) const {
    if constexpr (on) {
#pragma unroll
      for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            s[mt][nt][x] = logit(s[mt][nt][x], row0 + 16 * mt + 8 * (x / 2), key0 + 8 * nt + x % 2);
          }
        }
      }
    }
  }

  // The logits of keys key0 .. key0 + Keys - 1 of row i, for a thread that holds whole rows.
  template <int Keys>
  __device__ __forceinline__ void apply_row(float (&s)[Keys], int i, int key0) const {
    if constexpr (on) {
#pragma unroll
      for (int j = 0; j < Keys; ++j) s[j] = logit(s[j], i, key0 + j);
    }
  }

  // The sink logit of row i (row_sink); -inf for a row past the sequence, which is not stored.
  __device__ __forceinline__ float row_sink(const ScoreParams& score, int i) const {
    if (i >= seqlen_q) return neg_inf();
    VariantCoords at = sequence;
    at.query = i;
    at.key = -1;
    return attention::row_sink<Spec>(score, at);
  }

  // The sink logit of each of a thread's fragment rows, row0 + 8 r.
  template <int Rows>
  __device__ __forceinline__ void row_sinks(float (&sink)[Rows], const ScoreParams& score,
                                            int row0) const {
#pragma unroll
    for (int r = 0; r < Rows; ++r) sink[r] = row_sink(score, row0 + 8 * r);
  }

  __device__ __forceinline__ float logit(float score, int i, int j) const {
    float x = score * scale;
    if constexpr (Spec::has_softcap) x = softcap * Math::tanh(x * inv_softcap);
    if constexpr (Spec::has_alibi) x -= alibi_slope * static_cast<float>(abs(i + offset - j));
    if constexpr (Spec::has_bias || Spec::has_variant) {
      if (i < seqlen_q && j < seqlen_k) {  // the tile overhangs the tensor; masked there anyway
        if constexpr (Spec::has_bias)
          x += to_float(bias[i * bias_row_stride + j * bias_col_stride]);
        VariantCoords at = sequence;
        at.query = i;
        at.key = j;
        x = variant_logit<Spec>(*variant, at, x);
      }
    }
    return x;
  }
};

// The ALiBi slope of query head `head` of sequence `batch` (spec has_alibi).
__device__ __forceinline__ float alibi_slope(const ScoreParams& score, int batch, int head) {
  return score.maybe_alibi_slopes[batch * score.alibi_batch_stride + head];
}

template <class Spec, class Math>
__device__ __forceinline__ LogitTransform<Spec, Math> make_logit_transform(const AttentionParams& p,
                                                                           const Sequence& seq,
                                                                           const Band& band) {
  LogitTransform<Spec, Math> f;
  f.scale = p.score.softmax_scale;
  f.softcap = p.score.softcap;
  f.inv_softcap = Spec::has_softcap ? 1.f / p.score.softcap : 0.f;
  f.alibi_slope = 0.f;
  if constexpr (Spec::has_alibi) f.alibi_slope = alibi_slope(p.score, seq.batch, seq.head);
  f.offset = band.offset;
  f.seqlen_q = seq.seqlen_q;
  f.seqlen_k = seq.seqlen_k;
  f.bias = nullptr;
  if constexpr (Spec::has_bias) {
    f.bias = static_cast<const typename Spec::dtype*>(p.maybe_bias) +
             seq.batch * p.bias_batch_stride + seq.head * p.bias_head_stride;
  }
  f.bias_row_stride = p.bias_row_stride;
  f.bias_col_stride = p.bias_col_stride;
  f.variant = &p.score.variant;
  f.sequence = {seq.batch, seq.head, seq.head / (p.heads / p.heads_kv), 0, 0, band.offset};
  return f;
}

// Sets the logits of keys key0 .. key0 + Keys - 1 outside row i's band to -inf.
template <int Keys>
__device__ __forceinline__ void mask_row(float (&s)[Keys], const Band& band, int i, int key0) {
  const int first = band.first_key(i);
  const int last = band.last_key(i);
#pragma unroll
  for (int j = 0; j < Keys; ++j) {
    if (key0 + j < first || key0 + j > last) s[j] = neg_inf();
  }
}

// Sets logits outside each row's band to -inf; row0 is the thread's row of tile 0, half 0.
template <int MTiles, int STiles>
__device__ __forceinline__ void mask_logits(float (&s)[MTiles][STiles][4], const Band& band,
                                            int row0, int key0) {
#pragma unroll
  for (int r = 0; r < 2 * MTiles; ++r) {
    const int first = band.first_key(row0 + 8 * r);
    const int last = band.last_key(row0 + 8 * r);
#pragma unroll
    for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = key0 + 8 * nt + e;
        if (j < first || j > last) s[r / 2][nt][2 * (r % 2) + e] = neg_inf();
      }
    }
  }
}

}  // namespace kiln::attention
