// SPDX-License-Identifier: Apache-2.0
// Row-major strides, shared by TensorView::contiguous and the C API's views of DLPack tensors
// that come without strides.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>

#include "kiln/tensor.hpp"

namespace kiln::detail {

// The strides of a compact row-major tensor of `shape` (at most TensorView::max_rank dims; the
// rest 0), or nullopt when one of them does not fit int64.
std::optional<std::array<std::int64_t, TensorView::max_rank>> compact_strides(
    std::span<const std::int64_t> shape);

}  // namespace kiln::detail
