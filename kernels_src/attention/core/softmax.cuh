// SPDX-License-Identifier: Apache-2.0
// Online softmax (FlashAttention-2) over one warp's score fragments: running row max and sum in
// fp32, rescaling the output accumulators when the max grows, normalizing once at the end.
#pragma once

#include "attention/core/math.cuh"
#include "common/mma.cuh"

namespace kiln::attention {

// Each thread holds rows g and g + 8 (g = lane / 4) of each of the warp's MTiles m16 tiles,
// shared with the 3 other lanes of its quad: row r = 2 * tile + half. VoteFrom: the output
// accumulators per thread from which rescale_output votes to skip the multiplies. Slack: how far
// (in base-2 units) a row's logits may rise above its running max before the max follows them;
// 0 follows every rise. The sum, o and the LSE all count from the running max, so the result is
// the same; probabilities then reach at most 2^Slack, which fp32 sums and fp16/bf16 P operands
// hold with their usual relative precision, and once a row's max is near its final value no
// step rescales o. Offset: probabilities count from 2^Offset instead of 1 (at most 2^(Slack +
// Offset)), and so do the sums, so that an fp8 P operand holds small ones in its normal range;
// finish() takes it back out of the LSE.
template <int MTiles, int VoteFrom = 128, int Slack = 0, int Offset = 0>
struct OnlineSoftmax {
  static constexpr int rows = 2 * MTiles;
  // Whether rescale_output votes to skip the multiplies for o of OTiles n8 tiles (4 accumulators
  // each per thread).
  template <int OTiles>
  static constexpr bool votes = VoteFrom <= 4 * (MTiles * OTiles);
  float row_max[rows];  // of logits seen so far, equal across the quad
  float row_sum[rows];  // this thread's share of the sum; the quad's shares add up at the end

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < rows; ++r) {
      row_max[r] = neg_inf();
      row_sum[r] = 0.f;
    }
  }

  // Turns logits s into unnormalized probabilities exp2(s * to_log2 - max * to_log2) and
  // rescales o to the new max. to_log2 takes logits to base-2 units (it folds the softmax scale
  // in when the logits are raw scores).
  template <int STiles, int OTiles>
  __device__ __forceinline__ void update(float (&s)[MTiles][STiles][4],
                                         float (&o)[MTiles][OTiles][4], float to_log2) {
    float rescale[rows];
    exponentiate(s, to_log2, rescale);
    rescale_output(o, rescale);
  }

  // update() without touching o: the factors o must be rescaled by go to `rescale`, so that a
  // kernel can rescale o later, once the products still adding into it are done.
  template <int STiles>
  __device__ __forceinline__ void exponentiate(float (&s)[MTiles][STiles][4], float to_log2,
                                               float (&rescale)[rows]) {
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * mt + half;
        float m = row_max[r];
#pragma unroll
        for (int nt = 0; nt < STiles; ++nt) {
          m = fmaxf(m, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        }
        m = mma::quad_max(m);
        // NOTE: the difference is +inf or NaN only when the running max is -inf (no logit yet),
        // where the max must follow.
        if (Slack > 0 && (m - row_max[r]) * to_log2 <= static_cast<float>(Slack)) m = row_max[r];
        const float shift = softmax_shift(m, to_log2);
        rescale[r] = softmax_rescale<mma::ApproxMath>(row_max[r], m, shift, to_log2);
        row_max[r] = m;
        float sum = row_sum[r] * rescale[r];
        float bias = -shift;
        if constexpr (Offset != 0) bias += static_cast<float>(Offset);
#pragma unroll
        for (int nt = 0; nt < STiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float p = mma::exp2_approx(fmaf(s[mt][nt][2 * half + e], to_log2, bias));
            s[mt][nt][2 * half + e] = p;
            sum += p;
          }
        }
        row_sum[r] = sum;
      }
    }
  }

  // o *= rescale per row. Once the row maxima settle most steps leave every rescale at 1; when
  // o is large a warp vote that skips the multiplies then pays for itself. Measured on an H200:
  // in the forward kernel +3-6% at head dims 128 and 256 (>= 128 accumulators), -7% at 64; the
  // decode kernel, issue-bound with one warp per scheduler, votes from 64.
  template <int OTiles>
  __device__ __forceinline__ void rescale_output(float (&o)[MTiles][OTiles][4],
                                                 const float (&rescale)[rows]) {
    if constexpr (votes<OTiles>) {
      bool grew = false;
#pragma unroll
      for (int r = 0; r < rows; ++r) grew |= rescale[r] != 1.f;
      if (!mma::warp_any(grew)) return;
    }
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
      for (int j = 0; j < OTiles; ++j) {
#pragma unroll
        for (int x = 0; x < 4; ++x) o[mt][j][x] *= rescale[2 * mt + x / 2];
      }
    }
  }

  // Normalizes o by the row sums and gives each row's natural-log sum of exp of its logits
  // (-inf, with o = 0, for a row that attended no key). Each row's sink logit (natural units;
  // -inf: none) joins its sum, and so its LSE, with no value (add_sink). Scaled: o is also
  // multiplied by `scale` (an fp8 V's descale); a compile-time choice, for a multiplication by a
  // constant 1 still changed the machine code of sm_80's masked kernels.
  template <bool Scaled = false, int OTiles>
  __device__ __forceinline__ void finish(float (&o)[MTiles][OTiles][4], float to_log2,
                                         float (&lse)[rows], const float (&sink)[rows],
                                         float scale = 1.f) {
#pragma unroll
    for (int mt = 0; mt < MTiles; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = 2 * mt + half;
        float sum = mma::quad_sum(row_sum[r]);
        float shift = softmax_shift(row_max[r], to_log2);
        if constexpr (Offset != 0) shift -= static_cast<float>(Offset);  // what the sum counts from
        const float factor = add_sink(sink[r], shift, sum);
        // NOTE: a reciprocal times the factor, not a division: with no sink the factor is 1,
        // and the epilogue of a short tile is not free.
        float inv = (attended(sum) ? 1.f / sum : 0.f) * factor;
        if constexpr (Scaled) inv *= scale;
        lse[r] = row_lse(shift, sum);
#pragma unroll
        for (int j = 0; j < OTiles; ++j) {
          o[mt][j][2 * half] *= inv;
          o[mt][j][2 * half + 1] *= inv;
        }
      }
    }
  }
};

}  // namespace kiln::attention
