// SPDX-License-Identifier: Apache-2.0
// Files compiled into the library: the kernel tree as it was at build time, and the Params
// headers that every JIT compile gets from the library itself.
#pragma once

#include <span>
#include <string_view>
#include <vector>

namespace kiln::detail {

struct EmbeddedFile {
  const char* path;  // relative to kernels_src, or "kiln/params/<name>.h"
  std::string_view content;
};

std::span<const EmbeddedFile> embedded_kernels();
std::span<const EmbeddedFile> embedded_params();

}  // namespace kiln::detail
