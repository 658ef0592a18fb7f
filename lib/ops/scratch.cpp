// SPDX-License-Identifier: Apache-2.0
// Device scratch of one call from the runtime's stream-ordered allocator.
#include "ops/scratch.hpp"

#include "kiln/error.hpp"
#include "runtime/device_calls.hpp"

namespace kiln::detail {

Scratch::Scratch(Runtime& runtime, std::size_t bytes, void* stream)
    : runtime_(runtime),
      stream_(stream),
      base_(bytes ? static_cast<std::byte*>(allocate_async(runtime, bytes, stream)) : nullptr) {}

Scratch::~Scratch() {
  if (base_ == nullptr) return;
  try {
    free_async(runtime_, base_, stream_);
  } catch (const Error&) {
    // NOTE: only reachable when the driver is already failing; the error that got us here (or
    // the next call's) reports it.
  }
}

std::size_t scratch_align(std::size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace kiln::detail
