// SPDX-License-Identifier: Apache-2.0
// The CPU attention reference: plain loops in fp64, and the same maths rounded to the input dtype.
#include "attention_reference.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace kiln::test {

namespace {

// The value of fp8 code `bits` (the low byte): OCP's E4M3FN (no infinities, NaN at S.1111.111) or
// E5M2 (IEEE-style).
double fp8_value(DType dtype, unsigned bits) {
  const double sign = bits & 0x80u ? -1.0 : 1.0;
  const bool e4m3 = dtype == DType::e4m3;
  const int mantissa_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
  const unsigned exponent = (bits & 0x7fu) >> mantissa_bits;
  const unsigned mantissa = bits & ((1u << mantissa_bits) - 1);
  if (e4m3 && (bits & 0x7fu) == 0x7fu) return std::numeric_limits<double>::quiet_NaN();
  if (!e4m3 && exponent == 31) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  const double fraction = static_cast<double>(mantissa) / (1 << mantissa_bits);
  if (exponent == 0) return sign * std::ldexp(fraction, 1 - bias);
  return sign * std::ldexp(1.0 + fraction, static_cast<int>(exponent) - bias);
}

// The fp8 code nearest `value`, ties to the even code; NaN past the largest finite value (E4M3FN)
// or infinity (E5M2), as a cast in PyTorch gives.
std::uint16_t fp8_bits(DType dtype, double value) {
  const bool e4m3 = dtype == DType::e4m3;
  if (std::isnan(value)) return e4m3 ? 0x7f : 0x7e;
  const unsigned sign = std::signbit(value) ? 0x80u : 0u;
  const double magnitude = std::fabs(value);
  const unsigned largest = e4m3 ? 0x7e : 0x7b;  // the largest finite code
  const double beyond =
      fp8_value(dtype, largest) + (fp8_value(dtype, largest) - fp8_value(dtype, largest - 1)) / 2;
  if (magnitude >= beyond) return static_cast<std::uint16_t>(sign | (e4m3 ? 0x7fu : 0x7cu));
  unsigned lo = 0, hi = largest;  // the codes' values grow with them
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    (fp8_value(dtype, mid) <= magnitude ? lo : hi) = mid;
  }
  const double below = magnitude - fp8_value(dtype, lo), above = fp8_value(dtype, hi) - magnitude;
  const unsigned code = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<std::uint16_t>(sign | code);
}

}  // namespace

double fp8_largest(DType dtype) {
  return fp8_value(dtype, dtype == DType::e4m3 ? 0x7e : 0x7b);
}

std::uint16_t to_bits(DType dtype, double value) {
  if (is_fp8(dtype)) return fp8_bits(dtype, value);
  if (dtype == DType::f16) return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
  if (dtype != DType::bf16) throw std::invalid_argument("to_bits takes f16, bf16 or fp8");
  // Round to nearest even on the float bits (through float: a double rounding, harmless here).
  const std::uint32_t u = std::bit_cast<std::uint32_t>(static_cast<float>(value));
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

double from_bits(DType dtype, std::uint16_t bits) {
  if (is_fp8(dtype)) return fp8_value(dtype, bits & 0xffu);
  if (dtype == DType::f16) return static_cast<double>(std::bit_cast<_Float16>(bits));
  if (dtype != DType::bf16) throw std::invalid_argument("from_bits takes f16, bf16 or fp8");
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

double round_to(DType dtype, double value) {
  if (dtype == DType::f32) return static_cast<float>(value);
  return from_bits(dtype, to_bits(dtype, value));
}

std::vector<double> random_normal(DType dtype, std::size_t count, std::mt19937& rng) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> values(count);
  for (double& x : values) x = round_to(dtype, normal(rng));
  return values;
}

std::int64_t Strided::count() const {
  std::int64_t n = 1;
  for (std::int64_t size : shape) n *= size;
  return n;
}

std::int64_t Strided::extent() const {
  if (count() == 0) return offset;
  std::int64_t last = offset;
  for (std::size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
  return last + 1;
}

Strided Strided::dense(std::vector<std::int64_t> shape) {
  Strided layout{.shape = std::move(shape), .strides = {}, .offset = 0};
  layout.strides.resize(layout.shape.size());
  std::int64_t stride = 1;
  for (std::size_t d = layout.shape.size(); d-- > 0;) {
    layout.strides[d] = stride;
    stride *= layout.shape[d];
  }
  return layout;
}

void for_each_element(const Strided& layout,
                      const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const std::int64_t n = layout.count();
  std::vector<std::int64_t> index(layout.shape.size(), 0);
  std::int64_t position = layout.offset;
  for (std::int64_t linear = 0; linear < n; ++linear) {
    fn(linear, position);
    // Odometer step over the logical index, moving the buffer position along with it.
    for (std::size_t d = index.size(); d-- > 0;) {
      position += layout.strides[d];
      if (++index[d] < layout.shape[d]) break;
      position -= layout.strides[d] * layout.shape[d];
      index[d] = 0;
    }
  }
}

void scatter(DType dtype, const Strided& layout, const std::vector<double>& values,
             std::vector<std::uint16_t>& buffer) {
  if (static_cast<std::int64_t>(values.size()) != layout.count() ||
      layout.extent() > static_cast<std::int64_t>(buffer.size())) {
    throw std::invalid_argument("scatter: values or buffer do not fit the layout");
  }
  for_each_element(layout, [&](std::int64_t i, std::int64_t at) {
    buffer[static_cast<std::size_t>(at)] = to_bits(dtype, values[static_cast<std::size_t>(i)]);
  });
}

std::vector<double> gather(DType dtype, const Strided& layout,
                           const std::vector<std::uint16_t>& buffer) {
  if (layout.extent() > static_cast<std::int64_t>(buffer.size())) {
    throw std::invalid_argument("gather: the buffer does not fit the layout");
  }
  std::vector<double> values(static_cast<std::size_t>(layout.count()));
  for_each_element(layout, [&](std::int64_t i, std::int64_t at) {
    values[static_cast<std::size_t>(i)] = from_bits(dtype, buffer[static_cast<std::size_t>(at)]);
  });
  return values;
}

std::vector<double> random_sinks(int heads, int keys, std::mt19937& rng) {
  std::uniform_real_distribution<double> around(-3.0, 3.0);
  std::vector<double> sinks;
  for (int h = 0; h < heads; ++h) {
    const double sink = std::log(std::max(keys, 1)) + around(rng);
    sinks.push_back(static_cast<double>(static_cast<float>(sink)));
  }
  if (heads >= 3) sinks.back() = -std::numeric_limits<double>::infinity();
  return sinks;
}

void ReferenceProblem::set_padded(int batch_count, int seqlen_q, int seqlen_k) {
  cu_seqlens_q.assign(1, 0);
  cu_seqlens_k.assign(1, 0);
  for (int b = 0; b < batch_count; ++b) {
    cu_seqlens_q.push_back(cu_seqlens_q.back() + seqlen_q);
    cu_seqlens_k.push_back(cu_seqlens_k.back() + seqlen_k);
  }
}

void ReferenceProblem::set_lengths(const std::vector<int>& seqlens_q,
                                   const std::vector<int>& seqlens_k) {
  if (seqlens_q.size() != seqlens_k.size()) throw std::invalid_argument("set_lengths: sizes");
  cu_seqlens_q.assign(1, 0);
  cu_seqlens_k.assign(1, 0);
  for (std::size_t b = 0; b < seqlens_q.size(); ++b) {
    cu_seqlens_q.push_back(cu_seqlens_q.back() + seqlens_q[b]);
    cu_seqlens_k.push_back(cu_seqlens_k.back() + seqlens_k[b]);
  }
}

// The plain-dtype baseline approximates FlashAttention's own (attention_ref with upcast=False):
// there q.k^T is a matmul in the input dtype (fp32 accumulation, result rounded to the dtype),
// softcap and a logit hook run in the dtype, ALiBi and bias are added in fp32, softmax runs in fp32
// and its P is rounded to the dtype before P.V, whose result is rounded to the dtype once more.
// Here the accumulations are fp64 and the softmax fp64; the roundings to the dtype, which dominate
// the error, are the same.
void for_each_softmax_row(const ReferenceProblem& p, const std::vector<double>& q,
                          const std::vector<double>& k,
                          const std::function<void(const SoftmaxRow&)>& fn) {
  const auto hq = static_cast<std::size_t>(p.heads), hkv = static_cast<std::size_t>(p.heads_kv);
  const auto d = static_cast<std::size_t>(p.head_dim);
  const double inf = std::numeric_limits<double>::infinity();
  SoftmaxRow r;
  for (int b = 0; b < p.batch(); ++b) {
    const int q_start = p.cu_seqlens_q[static_cast<std::size_t>(b)];
    const int k_start = p.cu_seqlens_k[static_cast<std::size_t>(b)];
    const int seqlen_q = p.cu_seqlens_q[static_cast<std::size_t>(b) + 1] - q_start;
    const int seqlen_k = p.seqused_k.empty()
                             ? p.cu_seqlens_k[static_cast<std::size_t>(b) + 1] - k_start
                             : p.seqused_k[static_cast<std::size_t>(b)];
    const int offset = p.top_left ? 0 : seqlen_k - seqlen_q;
    for (int h = 0; h < p.heads; ++h) {
      const std::size_t h_kv = static_cast<std::size_t>(h / (p.heads / p.heads_kv));
      double slope = 0;
      if (p.alibi_slopes.size() == hq) slope = p.alibi_slopes[static_cast<std::size_t>(h)];
      if (p.alibi_slopes.size() > hq) {
        slope = p.alibi_slopes[static_cast<std::size_t>(b) * hq + static_cast<std::size_t>(h)];
      }
      for (int i = 0; i < seqlen_q; ++i) {
        const std::size_t row = static_cast<std::size_t>(q_start + i);
        const int first = p.window_left < 0 ? 0 : std::max(0, i + offset - p.window_left);
        const int last =
            p.window_right < 0 ? seqlen_k - 1 : std::min(seqlen_k - 1, i + offset + p.window_right);
        double sink = p.sinks.empty() ? -inf : p.sinks[static_cast<std::size_t>(h)];
        if (p.row_sink) sink = p.row_sink(b, h, i, sink);
        r.batch = b;
        r.head = h;
        r.head_kv = static_cast<int>(h_kv);
        r.token = q_start + i;
        r.first_key = k_start + first;
        r.p.clear();
        r.p_plain.clear();
        r.dtanh.clear();
        r.dtanh_plain.clear();
        r.dhook.clear();
        r.dhook_plain.clear();
        if (last < first) {  // fully masked: out 0, and lse -inf or the sink
          r.lse = sink;
          r.sink_p = r.sink_p_plain = sink > -inf ? 1 : 0;
          fn(r);
          continue;
        }
        const double* qi = &q[(row * hq + static_cast<std::size_t>(h)) * d];
        for (int j = first; j <= last; ++j) {
          const double* kj = &k[(static_cast<std::size_t>(k_start + j) * hkv + h_kv) * d];
          double dot = 0;
          for (std::size_t c = 0; c < d; ++c) dot += qi[c] * kj[c];
          double s = p.softmax_scale * dot;
          double sp = round_to(p.dtype, s);
          double dtanh = 1, dtanh_plain = 1, dhook = 1, dhook_plain = 1;
          if (p.softcap > 0) {
            const double t = std::tanh(s / p.softcap), t_plain = std::tanh(sp / p.softcap);
            s = p.softcap * t;
            sp = round_to(p.dtype, p.softcap * t_plain);
            dtanh = 1 - t * t;
            const double t_stored = round_to(p.dtype, t_plain);  // eager's tanh output
            dtanh_plain = 1 - t_stored * t_stored;
          }
          double add = -slope * std::abs(i + offset - j);
          if (p.bias) add += p.bias(b, h, i, j);
          s += add;
          sp += add;
          if (p.logit) {  // in the dtype, as softcap
            dhook = p.logit_grad(b, h, i, j, s);
            dhook_plain = round_to(p.dtype, p.logit_grad(b, h, i, j, sp));
            s = p.logit(b, h, i, j, s);
            sp = round_to(p.dtype, p.logit(b, h, i, j, sp));
          }
          r.p.push_back(s);
          r.p_plain.push_back(sp);
          r.dtanh.push_back(dtanh);
          r.dtanh_plain.push_back(dtanh_plain);
          r.dhook.push_back(dhook);
          r.dhook_plain.push_back(dhook_plain);
        }
        const double max = std::max(sink, *std::max_element(r.p.begin(), r.p.end()));
        if (max == -inf) {  // the bias masked every key, and no sink: as fully masked
          r.lse = -inf;
          std::fill(r.p.begin(), r.p.end(), 0.0);
          std::fill(r.p_plain.begin(), r.p_plain.end(), 0.0);
          r.sink_p = r.sink_p_plain = 0;
          fn(r);
          continue;
        }
        const double max_plain =
            std::max(sink, *std::max_element(r.p_plain.begin(), r.p_plain.end()));
        double sum = std::exp(sink - max), sum_plain = std::exp(sink - max_plain);
        for (double& s : r.p) {
          s = std::exp(s - max);
          sum += s;
        }
        for (double& s : r.p_plain) {
          s = std::exp(s - max_plain);
          sum_plain += s;
        }
        for (double& s : r.p) s /= sum;
        for (double& s : r.p_plain) {
          s = p.p_fp8 ? round_to(*p.p_fp8, 256 * s) / 256 / sum_plain
                      : round_to(p.dtype, s / sum_plain);
        }
        r.lse = max + std::log(sum);
        r.sink_p = std::exp(sink - max) / sum;
        r.sink_p_plain = std::exp(sink - max_plain) / sum_plain;
        fn(r);
      }
    }
  }
}

ReferenceResult attention_reference(const ReferenceProblem& p, const std::vector<double>& q,
                                    const std::vector<double>& k, const std::vector<double>& v) {
  const int total_q = p.cu_seqlens_q.back();
  const int total_k = p.cu_seqlens_k.back();
  const auto hq = static_cast<std::size_t>(p.heads), hkv = static_cast<std::size_t>(p.heads_kv);
  const auto d = static_cast<std::size_t>(p.head_dim), dv = static_cast<std::size_t>(p.head_dim_v);
  if (q.size() != static_cast<std::size_t>(total_q) * hq * d ||
      k.size() != static_cast<std::size_t>(total_k) * hkv * d ||
      v.size() != static_cast<std::size_t>(total_k) * hkv * dv || p.heads % p.heads_kv != 0) {
    throw std::invalid_argument("attention_reference: q, k or v does not match the problem");
  }
  ReferenceResult r;
  r.out.assign(static_cast<std::size_t>(total_q) * hq * dv, 0.0);
  r.out_plain.assign(r.out.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(total_q) * hq, -std::numeric_limits<double>::infinity());
  for_each_softmax_row(p, q, k, [&](const SoftmaxRow& row) {
    const auto token = static_cast<std::size_t>(row.token);
    const auto h = static_cast<std::size_t>(row.head);
    r.lse[h * static_cast<std::size_t>(total_q) + token] = row.lse;
    double* o = &r.out[(token * hq + h) * dv];
    double* o_plain = &r.out_plain[(token * hq + h) * dv];
    for (std::size_t n = 0; n < row.p.size(); ++n) {
      const std::size_t key = static_cast<std::size_t>(row.first_key) + n;
      const double* vj = &v[(key * hkv + static_cast<std::size_t>(row.head_kv)) * dv];
      for (std::size_t c = 0; c < dv; ++c) {
        o[c] += row.p[n] * vj[c];
        o_plain[c] += row.p_plain[n] * vj[c];
      }
    }
    for (std::size_t c = 0; c < dv; ++c) o_plain[c] = round_to(p.dtype, o_plain[c]);
  });
  return r;
}

ErrorReport compare_values(const std::vector<double>& got, const std::vector<double>& want,
                           const std::vector<double>& plain) {
  if (got.size() != want.size() || plain.size() != want.size()) {
    throw std::invalid_argument("compare_values: sizes differ");
  }
  ErrorReport report;
  for (std::size_t i = 0; i < got.size(); ++i) {
    report.baseline_error = std::max(report.baseline_error, std::fabs(plain[i] - want[i]));
    if (!std::isfinite(got[i])) {
      if (report.not_finite++ == 0) report.first_not_finite = static_cast<std::int64_t>(i);
      continue;
    }
    const double error = std::fabs(got[i] - want[i]);
    if (report.worst < 0 || error > report.max_error) {
      report.max_error = error;
      report.worst = static_cast<std::int64_t>(i);
    }
  }
  return report;
}

ErrorReport compare_output(const std::vector<double>& got, const ReferenceResult& ref) {
  return compare_values(got, ref.out, ref.out_plain);
}

std::string explain(const ErrorReport& report, const std::vector<double>& got,
                    const std::vector<double>& want, const std::vector<double>& plain, int heads,
                    int dim) {
  std::ostringstream s;
  s << "max error " << report.max_error << " bound " << report.bound() << " (baseline "
    << report.baseline_error << "), " << report.not_finite << " not finite (first "
    << report.first_not_finite << ")";
  if (report.worst >= 0) {
    const auto w = static_cast<std::size_t>(report.worst);
    const auto h = static_cast<std::size_t>(heads), n = static_cast<std::size_t>(dim);
    s << "; worst at token " << w / (h * n) << " head " << w / n % h << " col " << w % n << ": got "
      << got[w] << " want " << want[w] << " (plain dtype " << plain[w] << ")";
  }
  return s.str();
}

std::string explain(const ErrorReport& report, const std::vector<double>& got,
                    const ReferenceResult& ref, int heads, int dim_v) {
  return explain(report, got, ref.out, ref.out_plain, heads, dim_v);
}

LseReport compare_lse(const std::vector<double>& got, const std::vector<double>& want) {
  if (got.size() != want.size()) throw std::invalid_argument("compare_lse: sizes differ");
  LseReport report;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::isinf(want[i])
                        ? got[i] == want[i]
                        : std::fabs(got[i] - want[i]) <= 1e-3 * std::max(1.0, std::fabs(want[i]));
    if (!ok && report.bad++ == 0) report.first_bad = static_cast<std::int64_t>(i);
  }
  return report;
}

}  // namespace kiln::test
