// SPDX-License-Identifier: Apache-2.0
// TensorView: a non-owning view of a strided tensor in device memory.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kiln/spec.hpp"

namespace kiln {

// Shape and strides (in elements, not bytes) of up to 4 dims; dims past `rank` are unused.
// The data pointer is where element (0, ..., 0) lives. Nothing is copied or owned.
struct TensorView {
  static constexpr int max_rank = 4;

  void* data = nullptr;
  DType dtype = DType::bf16;
  int rank = 0;
  std::array<std::int64_t, max_rank> shape{};
  std::array<std::int64_t, max_rank> strides{};
  int device = 0;  // ordinal on the runtime's backend

  // A view of contiguous row-major memory.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                               int device = 0);

  std::int64_t size(int dim) const { return shape[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const { return strides[static_cast<std::size_t>(dim)]; }
  std::string describe() const;  // "bf16 (2, 1024, 16, 128) strides (...)"
};

}  // namespace kiln
