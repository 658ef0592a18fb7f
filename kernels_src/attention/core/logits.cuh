// SPDX-License-Identifier: Apache-2.0
// From q.k scores to the logits the softmax sees: the optional softcap, ALiBi and additive bias
// of a spec (each compiled only when on), then the band mask. Vendor-neutral: the tanh of the
// softcap comes from the Math the kernel passes (mma::ApproxMath or LibraryMath).
#pragma once

#include "attention/core/mask.cuh"
#include "attention/core/math.cuh"
#include "kiln/params/score.h"

namespace kiln::attention {

// Fragment coordinates (LogitTransform::apply and mask_logits, for the mma kernels, prefill and
// decode alike): thread (g = lane / 4, t = lane % 4) holds, for m16 tile mt and n8 tile nt, its
// row 2 * mt + half (half 0, 1) and key key0 + 8 * nt + e (e 0, 1) in accumulator element
// 2 * half + e, where key0 is the block's first key + 2 * t. Prefill's row r is query row0 + 8 r
// (row0 the warp's first row + g); decode's rows pack queries and heads.

// Which of the hooks of kiln/variant.hpp a user variant V defines; each is optional. A hook may
// be a static or a const member: it is called on the row's V (LogitRow::variant), which
// V::row(params, coords) makes when V has it (`state`), else V{}. The backward takes logit's
// derivative from logit_grad, or 1 where V declares logit_is_additive.
template <class V>
struct VariantHooks {
  // Stand-ins for the hooks' arguments, in unevaluated expressions only.
  static __device__ const VariantParams& params();
  static __device__ const VariantCoords& coords();

  template <class U>
  static constexpr __device__ auto logit_of(int)
      -> decltype(static_cast<const U*>(nullptr)->logit(params(), coords(), 0.f), true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool logit_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto logit_grad_of(int)
      -> decltype(static_cast<const U*>(nullptr)->logit_grad(params(), coords(), 0.f), true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool logit_grad_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto additive_of(int) -> decltype(bool{U::logit_is_additive}) {
    return U::logit_is_additive;
  }
  template <class U>
  static constexpr __device__ bool additive_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto mask_of(int)
      -> decltype(static_cast<bool>(static_cast<const U*>(nullptr)->mask(params(), coords())),
                  true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool mask_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto sink_of(int)
      -> decltype(static_cast<const U*>(nullptr)->sink(params(), coords(), 0.f), true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool sink_of(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto state_of(int)
      -> decltype(static_cast<U>(U::row(params(), coords())), true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool state_of(...) {
    return false;
  }
  // Whether U has a member of that name at all (not overloaded, not a template): one that is
  // there but cannot be called as its hook would otherwise be skipped without a word.
  template <class U>
  static constexpr __device__ auto names_logit(int) -> decltype(&U::logit, true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool names_logit(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto names_logit_grad(int) -> decltype(&U::logit_grad, true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool names_logit_grad(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto names_mask(int) -> decltype(&U::mask, true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool names_mask(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto names_sink(int) -> decltype(&U::sink, true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool names_sink(...) {
    return false;
  }
  template <class U>
  static constexpr __device__ auto names_row(int) -> decltype(&U::row, true) {
    return true;
  }
  template <class U>
  static constexpr __device__ bool names_row(...) {
    return false;
  }

  static constexpr bool logit = logit_of<V>(0);
  static constexpr bool logit_grad = logit_grad_of<V>(0);
  static constexpr bool logit_is_additive = additive_of<V>(0);
  static constexpr bool mask = mask_of<V>(0);
  static constexpr bool sink = sink_of<V>(0);
  static constexpr bool state = state_of<V>(0);
  static_assert(logit || !names_logit<V>(0),
                "kiln_variant::logit must be a static or const __device__ member float "
                "logit(const kiln::VariantParams&, const kiln::VariantCoords&, float) "
                "(kiln/variant.hpp)");
  static_assert(logit_grad || !names_logit_grad<V>(0),
                "kiln_variant::logit_grad must be a static or const __device__ member float "
                "logit_grad(const kiln::VariantParams&, const kiln::VariantCoords&, float) "
                "(kiln/variant.hpp)");
  static_assert((logit_grad || logit_is_additive) <= logit,
                "kiln_variant has a logit_grad or logit_is_additive but no logit hook for it "
                "(kiln/variant.hpp)");
  static_assert(!(logit_grad && logit_is_additive),
                "kiln_variant declares logit_is_additive and has a logit_grad too: an additive "
                "logit's derivative is 1, so keep one of them (kiln/variant.hpp)");
  static_assert(mask || !names_mask<V>(0),
                "kiln_variant::mask must be a static or const __device__ member bool mask(const "
                "kiln::VariantParams&, const kiln::VariantCoords&) (kiln/variant.hpp)");
  static_assert(sink || !names_sink<V>(0),
                "kiln_variant::sink must be a static or const __device__ member float sink(const "
                "kiln::VariantParams&, const kiln::VariantCoords&, float) (kiln/variant.hpp)");
  static_assert(state || !names_row<V>(0),
                "kiln_variant::row must be static __device__ kiln_variant row(const "
                "kiln::VariantParams&, const kiln::VariantCoords&), the variant of a row "
                "(kiln/variant.hpp)");
  static_assert(state || names_row<V>(0) || __is_empty(V),
                "kiln_variant has data members but no row() to fill them: add static __device__ "
                "kiln_variant row(const kiln::VariantParams&, const kiln::VariantCoords&) "
                "(kiln/variant.hpp)");
  static_assert(logit || mask || sink,
                "kiln_variant defines none of its hooks: give it a static or const __device__ "
                "member logit(const kiln::VariantParams&, const kiln::VariantCoords&, float), "
                "mask(const kiln::VariantParams&, const kiln::VariantCoords&) or sink(const "
                "kiln::VariantParams&, const kiln::VariantCoords&, float) (kiln/variant.hpp)");
};

// A spec's user variant, or an empty stand-in without one.
struct NoVariant {};
template <class Spec, bool = Spec::has_variant>
struct SpecVariant {
  using type = NoVariant;
};
template <class Spec>
struct SpecVariant<Spec, true> {
  using type = typename Spec::variant;
};

// Whether the backward takes d logit / d x from a spec's variant's logit_grad: the variant has a
// logit hook it does not declare additive.
template <class Spec, bool = Spec::has_variant>
struct VariantLogitGrad {
  static constexpr bool value = false;
};
template <class Spec>
struct VariantLogitGrad<Spec, true> {
  using Hooks = VariantHooks<typename Spec::variant>;
  static constexpr bool value = Hooks::logit && !Hooks::logit_is_additive;
};

// Whether a spec adds a bias tensor (prefill's has_bias; decode specs have none).
template <class Spec>
constexpr __device__ auto spec_has_bias(int) -> decltype(Spec::has_bias) {
  return Spec::has_bias;
}
template <class Spec>
constexpr __device__ bool spec_has_bias(...) {
  return false;
}

// Whether a spec writes the bias's gradient (the backward's dk/dv kernels' has_dbias).
template <class Spec>
constexpr __device__ auto spec_has_dbias(int) -> decltype(Spec::has_dbias) {
  return Spec::has_dbias;
}
template <class Spec>
constexpr __device__ bool spec_has_dbias(...) {
  return false;
}

// One row of logits: what they depend on besides the key. Its coordinates (at.key is set per
// logit; the query may lie past the sequence in a tile's overhang), its ALiBi slope and the
// variant's state for it (made from a real row).
template <class Spec>
struct LogitRow {
  VariantCoords at;
  float alibi_slope;
  typename SpecVariant<Spec>::type variant;
};

// The row at `at` (at.key unused): its ALiBi slope, and the variant built for it.
template <class Spec>
__device__ __forceinline__ LogitRow<Spec> make_logit_row(const ScoreParams& score,
                                                         VariantCoords at) {
  at.key = -1;
  LogitRow<Spec> row;
  row.at = at;
  row.alibi_slope = 0.f;
  if constexpr (Spec::has_alibi) {
    row.alibi_slope = score.maybe_alibi_slopes[at.batch * score.alibi_batch_stride + at.head];
  }
  if constexpr (Spec::has_variant) {
    using V = typename Spec::variant;
    if constexpr (VariantHooks<V>::state) {
      row.variant = V::row(score.variant, at);
    } else {
      row.variant = V{};
    }
  }
  return row;
}

// The sink logit of a row (natural units; -inf: none): the call's sink for its query head
// (ScoreOptions::sinks), through the variant's sink hook when it has one (at.key -1).
template <class Spec>
__device__ __forceinline__ float row_sink(const ScoreParams& score, const LogitRow<Spec>& row) {
  const float sink = score.maybe_sinks != nullptr ? score.maybe_sinks[row.at.head] : neg_inf();
  if constexpr (Spec::has_variant) {
    if constexpr (VariantHooks<typename Spec::variant>::sink) {
      return row.variant.sink(score.variant, row.at, sink);
    }
  }
  return sink;
}

// The score model on a thread's Rows rows of logits: scale, softcap, ALiBi, the bias (prefill)
// and the user variant's logit and mask hooks, then the band mask a tile needs. The band's
// bounds of each row come from the caller (mask_logits, or decode's own), as decode clips them
// to its split. RowStep > 0: row r's query is row 0's + RowStep r (prefill's fragments), said
// so to the compiler, which then sees that row r + 1 and key j + 8 lie as far apart as row r
// and key j and shares ALiBi-like terms between them; 0: each row has its own (decode's packed
// rows).
template <class Spec, class Math, int Rows, int RowStep>
struct LogitTransform {
  using Bias = typename Spec::dtype_q;  // the bias has q's dtype
  static constexpr bool has_bias = spec_has_bias<Spec>(0);
  static constexpr bool on = Spec::has_softcap || Spec::has_alibi || has_bias || Spec::has_variant;

  float scale;
  float softcap;
  float inv_softcap;
  int seqlen_q;
  int seqlen_k;
  bool overhang;     // some of the thread's rows lie past seqlen_q
  const Bias* bias;  // at (batch, head)
  long long bias_row_stride;
  long long bias_col_stride;
  const VariantParams* variant;
  LogitRow<Spec> rows[Rows];

  // Logits times this are in log2 units. Without transforms the logits stay raw scores and
  // the softmax scale rides along here, saving a multiply per score.
  __device__ __forceinline__ float to_log2() const { return on ? kLog2e : scale * kLog2e; }

  static constexpr bool variant_logit_grad = VariantLogitGrad<Spec>::value;

  // The backward's chain rule from the logit of key j in `row`, whose query is i, to its q.k
  // `score`: d logit / d score, the scale, times tanh's derivative under a softcap, times the
  // variant's logit_grad at the logit its logit hook is given. ALiBi, the bias, the band, an
  // additive variant and the mask hook add terms that do not depend on the score.
  __device__ __forceinline__ float score_grad(float score, const LogitRow<Spec>& row, int i,
                                              int j) const {
    float grad = scale;
    if constexpr (Spec::has_softcap) {
      const float t = Math::tanh(score * scale * inv_softcap);
      grad *= 1.f - t * t;
    }
    if constexpr (variant_logit_grad) {
      constexpr bool has_grad = VariantHooks<typename Spec::variant>::logit_grad;
      static_assert(has_grad,
                    "the backward needs the derivative of kiln_variant::logit: give kiln_variant "
                    "a static or const __device__ member float logit_grad(const "
                    "kiln::VariantParams&, const kiln::VariantCoords&, float x) returning "
                    "d logit / d x, or declare static constexpr bool logit_is_additive = true "
                    "where logit only adds a function of the coordinates to x (-inf masking) "
                    "(kiln/variant.hpp)");
      static_assert(!spec_has_dbias<Spec>(0),
                    "grads.dbias under a kiln_variant::logit that is not additive is not "
                    "supported yet (the bias's gradient would need logit_grad's factor): leave "
                    "dbias unset (kiln/variant.hpp)");
      // NOTE: the bias is read at clamped coordinates: this runs on every element of a tile.
      if constexpr (has_grad) {
        grad *= row.variant.logit_grad(*variant, coords(row, i, j),
                                       model_logit<true>(score, row, i, j));
      }
    }
    return grad;
  }

  // dS = dlogit grad, from dlogit = dL / d logit = P (dP - D) and grad = d logit / d score;
  // 0 where dlogit is (P is 0 where masked or past the sequence): logit_grad is called on every
  // element, as logit is, and what it returns there (inf or NaN, say) must not reach the
  // gradients.
  static __device__ __forceinline__ float score_ds(float dlogit, float grad) {
    if constexpr (variant_logit_grad) return dlogit == 0.f ? 0.f : dlogit * grad;
    return dlogit * grad;
  }

  // Row 0's row (its batch and head) with query i: the dk/dv kernels' rows, whose queries vary
  // along a tile. A variant with row state gets it made for query i (the last row for one past
  // the sequence, as make_logit_transform does).
  __device__ __forceinline__ LogitRow<Spec> row_at(int i) const {
    LogitRow<Spec> row = rows[0];
    row.at.query = i;
    if constexpr (Spec::has_variant) {
      using V = typename Spec::variant;
      if constexpr (VariantHooks<V>::state) {
        VariantCoords at = row.at;
        at.query = min(i, seqlen_q - 1);
        at.key = -1;
        row.variant = V::row(*variant, at);
      }
    }
    return row;
  }

  // The logits of a tile, then `mask()` on them where `masked`: s holds fragments
  // (float[MTiles][STiles][4], Rows == 2 * MTiles) or the thread's one whole row (float[Keys],
  // Rows == 1) of keys from key0. The bias is read at clamped coordinates only where some
  // overhang the sequence: the last key tile, and the rows past seqlen_q. The hooks are given
  // exact ones everywhere (variant_load bounds their reads): a second copy of the transform,
  // even one that never runs, cost a variant 2-4% (bench/RESULTS.md, run 20).
  template <class Tile, class Mask>
  __device__ __forceinline__ void apply(Tile& s, int key0, bool masked, const Mask& mask) const {
    if (has_bias && (overhang || last_key(s, key0) >= seqlen_k)) {
      each<true>(s, key0);
    } else {
      each<false>(s, key0);
    }
    if (masked) mask();
  }

  // The sink logit of each of the thread's rows (row_sink); a row past the sequence takes its
  // last row's.
  __device__ __forceinline__ void sinks(float (&sink)[Rows], const ScoreParams& score) const {
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      LogitRow<Spec> row = rows[r];
      row.at.query = min(row.at.query, seqlen_q - 1);
      sink[r] = row_sink<Spec>(score, row);
    }
  }

  // The query of the thread's row r (RowStep).
  __device__ __forceinline__ int query(int r) const {
    return RowStep > 0 ? rows[0].at.query + RowStep * r : rows[r].at.query;
  }

  // The logit of key j in `row`, whose query is i.
  template <bool Edge>
  __device__ __forceinline__ float logit(float score, const LogitRow<Spec>& row, int i,
                                         int j) const {
    float x = model_logit<Edge>(score, row, i, j);
    if constexpr (Spec::has_variant) {
      const VariantCoords at = coords(row, i, j);
      if constexpr (VariantHooks<typename Spec::variant>::logit) {
        x = row.variant.logit(*variant, at, x);
      }
      if constexpr (VariantHooks<typename Spec::variant>::mask) {
        if (!row.variant.mask(*variant, at)) x = neg_inf();
      }
    }
    return x;
  }

 private:
  // The hooks' coordinates of key j in `row`, whose query is i.
  static __device__ __forceinline__ VariantCoords coords(const LogitRow<Spec>& row, int i, int j) {
    VariantCoords at = row.at;
    at.query = i;
    at.key = j;
    return at;
  }

  // The logit of key j in `row`, whose query is i, before the variant's hooks: kiln's own score
  // model.
  template <bool Edge>
  __device__ __forceinline__ float model_logit(float score, const LogitRow<Spec>& row, int i,
                                               int j) const {
    float x = score * scale;
    if constexpr (Spec::has_softcap) x = softcap * Math::tanh(x * inv_softcap);
    if constexpr (Spec::has_alibi) {
      x -= row.alibi_slope * static_cast<float>(abs(i + row.at.offset - j));
    }
    if constexpr (has_bias) {
      const int bias_i = Edge ? min(i, seqlen_q - 1) : i;
      const int bias_j = Edge ? min(j, seqlen_k - 1) : j;
      x += to_float(bias[bias_i * bias_row_stride + bias_j * bias_col_stride]);
    }
    return x;
  }

  // The last key of the thread's part of a tile from key0.
  template <int MTiles, int STiles>
  static __device__ __forceinline__ int last_key(const float (&)[MTiles][STiles][4], int key0) {
    return key0 + 8 * (STiles - 1) + 1;
  }
  template <int Keys>
  static __device__ __forceinline__ int last_key(const float (&)[Keys], int key0) {
    return key0 + Keys - 1;
  }

  template <bool Edge, int MTiles, int STiles>
  __device__ __forceinline__ void each(float (&s)[MTiles][STiles][4], int key0) const {
    static_assert(Rows == 2 * MTiles, "one row per fragment half");
    if constexpr (on) {
#pragma unroll
      for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
        for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const int r = 2 * mt + x / 2;
            s[mt][nt][x] = logit<Edge>(s[mt][nt][x], rows[r], query(r), key0 + 8 * nt + x % 2);
          }
        }
      }
    }
  }

  template <bool Edge, int Keys>
  __device__ __forceinline__ void each(float (&s)[Keys], int key0) const {
    static_assert(Rows == 1, "one whole row per thread");
    if constexpr (on) {
#pragma unroll
      for (int j = 0; j < Keys; ++j) s[j] = logit<Edge>(s[j], rows[0], query(0), key0 + j);
    }
  }
};

// The transform's constants from the score model, for queries [0, seqlen_q) and keys
// [0, seqlen_k); no bias, rows unset, none overhanging.
template <class Spec, class Math, int Rows, int RowStep>
__device__ __forceinline__ LogitTransform<Spec, Math, Rows, RowStep> make_score_transform(
    const ScoreParams& score, int seqlen_q, int seqlen_k) {
  LogitTransform<Spec, Math, Rows, RowStep> f;
  f.scale = score.softmax_scale;
  f.softcap = score.softcap;
  f.inv_softcap = Spec::has_softcap ? 1.f / score.softcap : 0.f;
  f.seqlen_q = seqlen_q;
  f.seqlen_k = seqlen_k;
  f.overhang = false;
  f.bias = nullptr;
  f.bias_row_stride = 0;
  f.bias_col_stride = 0;
  f.variant = &score.variant;
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

// Sets each fragment row r's logits outside its keys [first[r], last[r]] to -inf.
template <int MTiles, int STiles>
__device__ __forceinline__ void mask_keys(float (&s)[MTiles][STiles][4],
                                          const int (&first)[2 * MTiles],
                                          const int (&last)[2 * MTiles], int key0) {
#pragma unroll
  for (int r = 0; r < 2 * MTiles; ++r) {
#pragma unroll
    for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = key0 + 8 * nt + e;
        if (j < first[r] || j > last[r]) s[r / 2][nt][2 * (r % 2) + e] = neg_inf();
      }
    }
  }
}

// Sets logits outside each row's band to -inf; row0 is the thread's row of tile 0, half 0.
template <int MTiles, int STiles>
__device__ __forceinline__ void mask_logits(float (&s)[MTiles][STiles][4], const Band& band,
                                            int row0, int key0) {
  int first[2 * MTiles];
  int last[2 * MTiles];
#pragma unroll
  for (int r = 0; r < 2 * MTiles; ++r) {
    first[r] = band.first_key(row0 + 8 * r);
    last[r] = band.last_key(row0 + 8 * r);
  }
  mask_keys(s, first, last, key0);
}

}  // namespace kiln::attention
