// SPDX-License-Identifier: Apache-2.0
// Zero-filled device memory that each stream keeps from call to call.
#include "backend/stream_zeros.hpp"

#include <algorithm>

#include "core/log.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {

// One allocation of a stream, given back when its last holder lets go.
struct StreamZeros::Memory {
  Driver& driver;
  int device;
  void* pointer;
  void* stream;
  // Set when the runtime closes: the stream may be gone by then (and its work must be done, as
  // for the kernels the runtime unloads), so the memory goes back outside any stream's order.
  bool closing = false;

  ~Memory() {
    try {
      if (closing) {
        driver.free(device, pointer);
      } else {
        driver.free_async(device, pointer, stream);
      }
    } catch (const Error& e) {
      // NOTE: at process exit the driver may already have shut down.
      log(LogLevel::debug, "giving back a stream's zeroed memory failed: {}", e.what());
    }
  }
};

StreamZeros::~StreamZeros() {
  for (auto& [id, block] : blocks_) block.memory->closing = true;
}

std::shared_ptr<void> StreamZeros::get(Driver& driver, int device, std::uint64_t id,
                                       std::size_t bytes, void* stream) {
  const std::lock_guard lock(mutex_);
  auto it = blocks_.find(id);
  if (it == blocks_.end()) {
    if (blocks_.size() == kStreams) return nullptr;
    it = blocks_.emplace(id, Block{}).first;
  }
  Block& block = it->second;
  if (block.bytes < bytes) {
    const std::size_t grown = std::max(bytes, 2 * block.bytes);
    void* pointer = driver.allocate_async(device, grown, stream);
    std::shared_ptr<Memory> memory(new Memory{driver, device, pointer, stream});
    driver.zero_async(device, pointer, grown, stream);
    block.memory = std::move(memory);
    block.bytes = grown;
  }
  return {block.memory, block.memory->pointer};
}

}  // namespace kiln::detail
