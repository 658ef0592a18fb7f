// TensorView helpers.
#include "kiln/tensor.hpp"

#include <fmt/format.h>

#include "kiln/error.hpp"

namespace kiln {

TensorView TensorView::contiguous(void* data, DType dtype,
                                  std::initializer_list<std::int64_t> shape, int device) {
  if (shape.size() > max_rank) {
    throw Error(
        ErrorCategory::invalid_argument,
        fmt::format("TensorView::contiguous got {} dims: at most {}", shape.size(), max_rank));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int i = view.rank - 1; i >= 0; --i) {
    const auto d = static_cast<std::size_t>(i);
    view.shape[d] = shape.begin()[i];
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
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
