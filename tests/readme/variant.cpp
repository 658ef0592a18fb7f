// SPDX-License-Identifier: Apache-2.0
// Wrapper of the README's user-variant snippet: q, k, v and out views, the segment ids' device
// pointer, sizes and a stream. The snippet needs a GPU, so it is compiled and linked here, and
// not called.
#include <cstdint>

#include <kiln/kiln.hpp>

void readme_snippet(const kiln::TensorView& q, const kiln::TensorView& k,
                    const kiln::TensorView& v, const kiln::TensorView& out, void* segment_ids,
                    std::int64_t batch, std::int64_t seqlen, void* stream) {
  using kiln::DType, kiln::TensorView;
  // README snippet
}

int main() {
  return 0;
}
