// Zero-filled device memory that each stream keeps from call to call.
#include "backend/stream_zeros.hpp"

#include <algorithm>

#include "kiln/error.hpp"
#include "log.hpp"

namespace kiln::detail {

StreamZeros::~StreamZeros() {
  for (const auto& [id, block] : blocks_) {
    try {
      release(block);
    } catch (const Error& e) {
      // NOTE: at process exit the driver may already have shut down.
      log(LogLevel::debug, "giving back a stream's zeroed memory failed: {}", e.what());
    }
  }
}

void* StreamZeros::get(Driver& driver, int device, std::uint64_t id, std::size_t bytes,
                       void* stream) {
  const std::lock_guard lock(mutex_);
  driver_ = &driver;
  device_ = device;
  auto it = blocks_.find(id);
  if (it == blocks_.end()) {
    if (blocks_.size() == kStreams) {
      const auto oldest = blocks_.find(recent_.back());
      release(oldest->second);
      recent_.pop_back();
      blocks_.erase(oldest);
    }
    recent_.push_front(id);
    it = blocks_.emplace(id, Block{.recent = recent_.begin()}).first;
  } else {
    recent_.splice(recent_.begin(), recent_, it->second.recent);
  }
  Block& block = it->second;
  if (block.bytes < bytes) {
    const std::size_t grown = std::max(bytes, 2 * block.bytes);
    release(block);
    block.pointer = nullptr;
    block.bytes = 0;
    void* fresh = driver.allocate(device, grown);
    try {
      driver.zero_async(device, fresh, grown, stream);
    } catch (const Error&) {
      driver.free(device, fresh);
      throw;
    }
    block.pointer = fresh;
    block.bytes = grown;
  }
  return block.pointer;
}

void StreamZeros::release(const Block& block) {
  // Driver::free waits for the work that may still use the memory, on whatever stream.
  if (block.pointer != nullptr) driver_->free(device_, block.pointer);
}

}  // namespace kiln::detail
