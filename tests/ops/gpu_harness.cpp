// SPDX-License-Identifier: Apache-2.0
// What the attention and decode [gpu] tests share.
#include "gpu_harness.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "support.hpp"

namespace kiln::test {
namespace {

// Uploads `values` as fp32 into `buffers`: a (heads) view, or (rows, heads) with `by_row`.
TensorView upload_f32(const std::vector<double>& values, int heads, bool by_row,
                      std::vector<std::unique_ptr<DeviceBuffer>>& buffers) {
  buffers.push_back(upload(std::vector<float>(values.begin(), values.end())));
  void* const data = buffers.back()->get();
  const auto rows = static_cast<std::int64_t>(values.size()) / heads;
  return by_row ? TensorView::contiguous(data, DType::f32, {rows, std::int64_t{heads}})
                : TensorView::contiguous(data, DType::f32, {std::int64_t{heads}});
}

}  // namespace

kiln::Options gpu_options() {
  static const TempDir cache;
  return isolated_options(cache.path());
}

std::string describe(const ScoreCase& s) {
  std::ostringstream out;
  if (s.causal) out << " causal";
  if (s.window_left >= 0 || s.window_right >= 0) {
    out << " window (" << s.window_left << ", " << s.window_right << ")";
  }
  if (s.top_left) out << " top-left";
  if (s.softcap > 0) out << " softcap " << s.softcap;
  if (s.softmax_scale) out << " scale " << *s.softmax_scale;
  const char* alibis[] = {"", " alibi per head", " alibi per batch and head"};
  out << alibis[static_cast<int>(s.alibi)];
  if (s.sinks) out << " sinks";
  if (s.variant != UserVariant::none) out << " variant " << to_string(s.variant);
  return out.str();
}

void set_reference_score(const ScoreCase& s, int head_dim, ReferenceProblem& ref) {
  // kiln's default is computed in float; the reference takes the same float.
  ref.softmax_scale = s.softmax_scale.value_or(1.0f / std::sqrt(static_cast<float>(head_dim)));
  ref.window_left = s.window_left;
  ref.window_right = s.causal ? 0 : s.window_right;
  ref.top_left = s.top_left;
  ref.softcap = s.softcap;
}

ScoreOptions score_options(const ScoreCase& s) {
  return {.softmax_scale = s.softmax_scale,
          .causal = s.causal,
          .window_left = s.window_left,
          .window_right = s.window_right,
          .top_left = s.top_left,
          .softcap = s.softcap};
}

void add_score_tensors(const ScoreCase& s, int batch, int heads, int sink_keys,
                       ReferenceProblem& ref, ScoreOptions& score,
                       std::vector<std::unique_ptr<DeviceBuffer>>& buffers, std::mt19937& rng) {
  if (s.alibi != Alibi::none) {
    const int rows = s.alibi == Alibi::per_batch_head ? batch : 1;
    std::uniform_real_distribution<float> slope(0.05f, 1.0f);
    ref.alibi_slopes.clear();
    for (int i = 0; i < rows * heads; ++i) ref.alibi_slopes.push_back(slope(rng));
    score.alibi_slopes =
        upload_f32(ref.alibi_slopes, heads, s.alibi == Alibi::per_batch_head, buffers);
  }
  if (s.sinks) {
    ref.sinks = random_sinks(heads, sink_keys, rng);
    score.sinks = upload_f32(ref.sinks, heads, false, buffers);
  }
}

std::int64_t guarded_size(std::initializer_list<const Strided*> layouts) {
  std::int64_t size = 0;
  for (const Strided* s : layouts) size = std::max(size, s->extent());
  return size + kGuard;
}

TensorView view_of(const DeviceBuffer& buffer, DType dtype, const Strided& s) {
  TensorView t;
  t.data = static_cast<std::byte*>(buffer.get()) +
           s.offset * static_cast<std::int64_t>(kiln::size_of(dtype));
  t.dtype = dtype;
  t.rank = static_cast<int>(s.shape.size());
  std::copy(s.shape.begin(), s.shape.end(), t.shape.begin());
  std::copy(s.strides.begin(), s.strides.end(), t.strides.begin());
  return t;
}

Output::Output(DType dtype, Strided layout)
    : dtype_(dtype),
      layout_(std::move(layout)),
      buffer_(static_cast<std::size_t>(guarded_size({&layout_})) * kiln::size_of(dtype)) {}

std::vector<double> Output::values(const std::vector<std::uint8_t>& bytes) const {
  std::vector<double> out(static_cast<std::size_t>(layout_.count()));
  const std::size_t size = kiln::size_of(dtype_);
  for_each_element(layout_, [&](std::int64_t i, std::int64_t at) {
    const std::uint8_t* const element = &bytes[static_cast<std::size_t>(at) * size];
    if (dtype_ == DType::f32) {
      float x;
      std::memcpy(&x, element, 4);
      out[static_cast<std::size_t>(i)] = x;
    } else {
      std::uint16_t x;
      std::memcpy(&x, element, 2);
      out[static_cast<std::size_t>(i)] = from_bits(dtype_, x);
    }
  });
  return out;
}

std::int64_t Output::written(const std::vector<std::uint8_t>& bytes) const {
  const std::size_t size = kiln::size_of(dtype_);
  std::int64_t count = 0;
  for (std::size_t at = 0; at < bytes.size(); at += size) {
    count += !std::all_of(&bytes[at], &bytes[at] + size, [](std::uint8_t b) { return b == 0xff; });
  }
  return count;
}

std::int64_t Output::written_outside(const std::vector<std::uint8_t>& bytes) const {
  std::vector<std::uint8_t> outside = bytes;
  const std::size_t size = kiln::size_of(dtype_);
  for_each_element(layout_, [&](std::int64_t, std::int64_t at) {
    std::fill_n(&outside[static_cast<std::size_t>(at) * size], size, std::uint8_t{0xff});
  });
  return written(outside);
}

void check_values(const Output& got, const std::vector<std::uint8_t>& bytes,
                  const std::vector<double>& want, const std::vector<double>& plain, int heads,
                  int dim) {
  const auto values = got.values(bytes);
  const ErrorReport error = compare_values(values, want, plain);
  INFO(explain(error, values, want, plain, heads, dim));
  CHECK(error.ok());
  CHECK(got.written_outside(bytes) == 0);
}

void check_out(const Output& out, const std::vector<std::uint8_t>& bytes,
               const ReferenceResult& want, int heads, int dim_v) {
  check_values(out, bytes, want.out, want.out_plain, heads, dim_v);
}

void check_lse(const Output& lse, const std::vector<std::uint8_t>& bytes,
               const std::vector<double>& want) {
  const auto got = lse.values(bytes);
  const LseReport report = compare_lse(got, want);
  const auto first = static_cast<std::size_t>(std::max<std::int64_t>(report.first_bad, 0));
  INFO(report.bad << " lse values off; the first at index " << report.first_bad << ": got "
                  << (got.empty() ? 0.0 : got[first]) << " want "
                  << (want.empty() ? 0.0 : want[first]));
  CHECK(report.ok());
  CHECK(lse.written_outside(bytes) == 0);
}

}  // namespace kiln::test
