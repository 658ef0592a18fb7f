// SPDX-License-Identifier: Apache-2.0
// The CPU reference of attention's backward pass: attention_reference's softmax rows, and plain
// loops over them in fp64 and rounded to the input dtype.
#include "attention_backward_reference.hpp"

#include <algorithm>
#include <stdexcept>

namespace kiln::test {

BiasShape bias_shape(const ReferenceProblem& p) {
  BiasShape s{.batch = static_cast<std::size_t>(p.batch()),
              .heads = static_cast<std::size_t>(p.heads)};
  for (std::size_t b = 0; b < s.batch; ++b) {
    s.seqlen_q =
        std::max(s.seqlen_q, static_cast<std::size_t>(p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b]));
    s.seqlen_k =
        std::max(s.seqlen_k, static_cast<std::size_t>(p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b]));
  }
  return s;
}

// Per row, with D = rowsum(dO * O): dP_j = dO . v_j, dS_j = P_j (dP_j - D) times the logit
// hook's logit_grad and the softcap's tanh', dq = scale * sum_j dS_j k_j, dk_j += scale * dS_j q,
// dv_j += P_j dO, and dsink -= P_sink D (the sink joins the denominator with no value, so
// d out / d sink = -P_sink out). The bias joins the logit after the softcap and before the logit
// hook: dbias_j = P_j (dP_j - D) times the hook's logit_grad.
//
// The plain-dtype baseline approximates FlashAttention's (PyTorch eager autograd through
// attention_ref with upcast=False), as attention_reference's does the forward: each matmul
// rounds its result to the dtype (dP = dO V^T, dV = P^T dO per query head, dQ = dS K * scale,
// dK = dS^T Q * scale per query head), the softmax's gradient dS = P (dP - D) with the rounded P
// and the rounded output's D is rounded to the dtype, then once more after the logit hook's
// derivative (the plain dbias) and after tanh's; GQA sums the rounded per-head dK and dV of a
// group and rounds the sum, as the backward of repeating k and v over the group does.
// Accumulations are fp64; dsinks stays fp32.
BackwardReference attention_backward_reference(const ReferenceProblem& p,
                                               const std::vector<double>& q,
                                               const std::vector<double>& k,
                                               const std::vector<double>& v,
                                               const std::vector<double>& dout,
                                               std::span<const double> stored_out) {
  BackwardReference r;
  r.forward = attention_reference(p, q, k, v);  // checks q, k and v
  if (dout.size() != r.forward.out.size()) {
    throw std::invalid_argument("attention_backward_reference: dout does not match out");
  }
  if (!stored_out.empty() && stored_out.size() != r.forward.out.size()) {
    throw std::invalid_argument("attention_backward_reference: stored_out does not match out");
  }
  const auto hq = static_cast<std::size_t>(p.heads), hkv = static_cast<std::size_t>(p.heads_kv);
  const auto d = static_cast<std::size_t>(p.head_dim), dv = static_cast<std::size_t>(p.head_dim_v);
  const auto total_k = static_cast<std::size_t>(p.cu_seqlens_k.back());
  const auto zeros = [](std::size_t size) {
    return GradientReference{std::vector<double>(size, 0.0), std::vector<double>(size, 0.0)};
  };
  r.dq = zeros(q.size());
  r.dk = zeros(k.size());
  r.dv = zeros(v.size());
  if (!p.sinks.empty()) r.dsinks = zeros(hq);
  const BiasShape bias = bias_shape(p);
  if (p.bias) r.dbias = zeros(bias.count());
  r.keyless.assign(r.forward.lse.size(), false);
  // The plain dK and dV of each query head, (total_k, heads, dim), before a group's sum.
  std::vector<double> dk_heads(total_k * hq * d, 0.0), dv_heads(total_k * hq * dv, 0.0);
  std::vector<double> dq_row(d);  // one row's plain dQ before its scale and rounding

  for_each_softmax_row(p, q, k, [&](const SoftmaxRow& row) {
    const std::size_t at =
        static_cast<std::size_t>(row.token) * hq + static_cast<std::size_t>(row.head);
    r.keyless[at] = std::all_of(row.p.begin(), row.p.end(), [](double x) { return x == 0; });
    const double* o = &r.forward.out[at * dv];
    const double* o_plain = &r.forward.out_plain[at * dv];
    const double* g = &dout[at * dv];
    const double* o_stored = stored_out.empty() ? o_plain : &stored_out[at * dv];
    double rowsum = 0, rowsum_plain = 0, rowsum_stored = 0;  // D
    for (std::size_t c = 0; c < dv; ++c) {
      rowsum += g[c] * o[c];
      rowsum_plain += g[c] * o_plain[c];
      rowsum_stored += g[c] * o_stored[c];
    }
    if (!p.sinks.empty()) {
      const auto h = static_cast<std::size_t>(row.head);
      r.dsinks.exact[h] -= row.sink_p * rowsum;
      r.dsinks.plain[h] -= row.sink_p_plain * rowsum_stored;
    }
    // The sequence's first query and key tokens, from which the bias counts its rows and keys.
    const auto batch = static_cast<std::size_t>(row.batch);
    const auto query0 = static_cast<std::size_t>(p.cu_seqlens_q[batch]);
    const auto key0 = static_cast<std::size_t>(p.cu_seqlens_k[batch]);
    const double* qi = &q[at * d];
    double* dqi = &r.dq.exact[at * d];
    std::fill(dq_row.begin(), dq_row.end(), 0.0);
    for (std::size_t n = 0; n < row.p.size(); ++n) {
      const std::size_t key = static_cast<std::size_t>(row.first_key) + n;
      const std::size_t kv_at = key * hkv + static_cast<std::size_t>(row.head_kv);
      const std::size_t head_at = key * hq + static_cast<std::size_t>(row.head);
      const double* kj = &k[kv_at * d];
      const double* vj = &v[kv_at * dv];
      double dp = 0;
      for (std::size_t c = 0; c < dv; ++c) dp += g[c] * vj[c];
      // dL / d the logit the hook was given, with the bias in it.
      const double dlogit = row.p[n] * (dp - rowsum) * row.dhook[n];
      const double dlogit_plain = round_to(
          p.dtype, round_to(p.dtype, row.p_plain[n] * (round_to(p.dtype, dp) - rowsum_plain)) *
                       row.dhook_plain[n]);
      if (p.bias) {
        const std::size_t at_bias =
            bias.at(batch, static_cast<std::size_t>(row.head),
                    static_cast<std::size_t>(row.token) - query0, key - key0);
        r.dbias.exact[at_bias] = dlogit;
        r.dbias.plain[at_bias] = dlogit_plain;
      }
      const double ds = p.softmax_scale * dlogit * row.dtanh[n];
      const double ds_plain = round_to(p.dtype, dlogit_plain * row.dtanh_plain[n]);
      for (std::size_t c = 0; c < d; ++c) {
        dqi[c] += ds * kj[c];
        dq_row[c] += ds_plain * kj[c];
        r.dk.exact[kv_at * d + c] += ds * qi[c];
        dk_heads[head_at * d + c] += ds_plain * qi[c];
      }
      for (std::size_t c = 0; c < dv; ++c) {
        r.dv.exact[kv_at * dv + c] += row.p[n] * g[c];
        dv_heads[head_at * dv + c] += row.p_plain[n] * g[c];
      }
    }
    for (std::size_t c = 0; c < d; ++c) {
      r.dq.plain[at * d + c] = round_to(p.dtype, p.softmax_scale * dq_row[c]);
    }
  });

  // Each kv head's plain dK and dV: its group's rounded per-head gradients, summed and rounded.
  const std::size_t group = hq / hkv;
  const auto reduce = [&](const std::vector<double>& heads, double scale, std::size_t dim,
                          std::vector<double>& out) {
    for (std::size_t key = 0; key < total_k; ++key) {
      for (std::size_t h = 0; h < hkv; ++h) {
        for (std::size_t c = 0; c < dim; ++c) {
          double sum = 0;
          for (std::size_t m = h * group; m < (h + 1) * group; ++m) {
            sum += round_to(p.dtype, scale * heads[(key * hq + m) * dim + c]);
          }
          out[(key * hkv + h) * dim + c] = round_to(p.dtype, sum);
        }
      }
    }
  };
  reduce(dk_heads, p.softmax_scale, d, r.dk.plain);
  reduce(dv_heads, 1.0, dv, r.dv.plain);
  for (double& x : r.dsinks.plain) x = round_to(DType::f32, x);
  return r;
}

GradientReference reduce_dbias(const ReferenceProblem& problem, const GradientReference& dbias,
                               bool over_batch, bool over_heads) {
  const BiasShape full = bias_shape(problem);
  if (dbias.exact.size() != full.count()) {
    throw std::invalid_argument("reduce_dbias: dbias is not the problem's");
  }
  BiasShape reduced = full;
  if (over_batch) reduced.batch = 1;
  if (over_heads) reduced.heads = 1;
  GradientReference r{std::vector<double>(reduced.count(), 0.0),
                      std::vector<double>(reduced.count(), 0.0)};
  for (std::size_t b = 0; b < full.batch; ++b) {
    for (std::size_t h = 0; h < full.heads; ++h) {
      for (std::size_t i = 0; i < full.seqlen_q; ++i) {
        for (std::size_t j = 0; j < full.seqlen_k; ++j) {
          const std::size_t to = reduced.at(over_batch ? 0 : b, over_heads ? 0 : h, i, j);
          r.exact[to] += dbias.exact[full.at(b, h, i, j)];
          r.plain[to] += dbias.plain[full.at(b, h, i, j)];
        }
      }
    }
  }
  for (double& x : r.plain) x = round_to(problem.dtype, x);
  return r;
}

}  // namespace kiln::test
