// SPDX-License-Identifier: Apache-2.0
// Wrapper of the README's unary snippet: device buffers x and y of n floats, and a stream. The
// snippet needs a GPU, so it is compiled and linked here, and not called.
#include <cstdint>

#include <kiln/kiln.hpp>

void readme_snippet(const void* x, void* y, std::int64_t n, void* stream) {
  // README snippet
}

int main() {
  return 0;
}
