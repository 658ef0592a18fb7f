// SPDX-License-Identifier: Apache-2.0
// Wrapper of the README's decode snippet: views of device tensors and a stream. The snippet needs
// a GPU, so it is compiled and linked here, and not called.
#include <kiln/kiln.hpp>

using kiln::TensorView;

void readme_snippet(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                    const TensorView& seqlens, const TensorView& block_table,
                    const TensorView& k_new, const TensorView& v_new, const TensorView& out,
                    const TensorView& lse, const TensorView& out_a, const TensorView& lse_a,
                    const TensorView& out_b, const TensorView& lse_b, void* stream) {
  // README snippet
}

int main() {
  return 0;
}
