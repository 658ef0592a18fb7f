// SPDX-License-Identifier: Apache-2.0
// TensorView helpers.
#include "kiln/tensor.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/checked_math.hpp"
#include "core/tensor_strides.hpp"
#include "kiln/error.hpp"

namespace kiln {

namespace detail {

std::optional<std::array<std::int64_t, TensorView::max_rank>> compact_strides(
    std::span<const std::int64_t> shape) {
  std::array<std::int64_t, TensorView::max_rank> strides{};
  std::int64_t stride = 1;
  for (std::size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    // NOTE: dim 0's size multiplies into no stride, so it cannot overflow one.
    if (d == 0) break;
    const std::optional<std::int64_t> next = checked_mul(stride, shape[d]);
    if (!next) return std::nullopt;
    stride = *next;
  }
  return strides;
}

}  // namespace detail

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, int device) {
  if (shape.size() > max_rank) {
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("TensorView::contiguous got {} dims: at most {}", shape.size(), max_rank));
  }
  const auto strides = detail::compact_strides({shape.begin(), shape.size()});
  if (!strides) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("TensorView::contiguous of shape ({}): its row-major strides do not "
                            "fit int64; use a smaller shape",
                            fmt::join(shape, ", ")));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  std::copy(shape.begin(), shape.end(), view.shape.begin());
  view.strides = *strides;
  return view;
}

std::string TensorView::describe() const {
  std::string shape_text, stride_text;
  for (int i = 0; i < rank; ++i) {
    shape_text += fmt::format("{}{}", i ? ", " : "", size(i));
    stride_text += fmt::format("{}{}", i ? ", " : "", stride(i));
  }
  return fmt::format("{} ({}) strides ({})", to_string(dtype), shape_text, stride_text);
}

}  // namespace kiln
