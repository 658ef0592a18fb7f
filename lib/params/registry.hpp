// The Params structs that kernels take, as the host library compiled them.
#pragma once

#include <cstddef>
#include <string_view>

namespace kiln::detail {

struct ParamsLayout {
  std::string_view type;    // "kiln::UnaryParams"
  std::string_view header;  // "kiln/params/elementwise.h", injected into the JIT compile
  std::size_t size;         // sizeof on the host; the generated unit static_asserts it
};

// Throws kiln::Error (invalid_argument) listing the known types when `type` is not one.
const ParamsLayout& params_layout(std::string_view type);

}  // namespace kiln::detail
