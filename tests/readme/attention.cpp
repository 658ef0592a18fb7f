// SPDX-License-Identifier: Apache-2.0
// Wrapper of the README's attention snippet: device pointers, sizes and a stream. The snippet
// needs a GPU, so it is compiled and linked here, and not called.
#include <cstdint>

#include <kiln/kiln.hpp>

void readme_snippet(void* q_ptr, void* k_ptr, void* v_ptr, void* out_ptr, std::int64_t batch,
                    std::int64_t seqlen_q, std::int64_t seqlen_k, std::int64_t heads,
                    std::int64_t heads_kv, void* stream) {
  // README snippet
}

int main() {
  return 0;
}
