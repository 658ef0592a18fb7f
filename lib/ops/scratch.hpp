// SPDX-License-Identifier: Apache-2.0
// Device scratch of one call from the runtime's stream-ordered allocator, for the ops that need
// some (decode's splits and rotated queries, the backward's row dots).
#pragma once

#include <cstddef>

#include "kiln/runtime.hpp"

namespace kiln::detail {

// Device scratch of one call, handed back on the stream however the call ends.
// NOTE: the next call's kernels may be scheduled while this call's kernel still uses the
// scratch that the stream-ordered allocator hands them again; that is safe only because every
// kernel launched with overlap_previous touches no global memory before wait_for_previous_grid.
class Scratch {
 public:
  Scratch(Runtime& runtime, std::size_t bytes, void* stream);
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  std::byte* at(std::size_t offset) const { return base_ + offset; }

 private:
  Runtime& runtime_;
  void* stream_;
  std::byte* base_;
};

// `bytes` rounded up to 256, so that each part of a call's scratch starts aligned for any access.
std::size_t scratch_align(std::size_t bytes);

}  // namespace kiln::detail
