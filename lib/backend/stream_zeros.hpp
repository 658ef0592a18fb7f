// SPDX-License-Identifier: Apache-2.0
// Zero-filled device memory that each stream keeps from call to call (Runtime::stream_zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "backend/backend.hpp"

namespace kiln::detail {

// NOTE: memory that starts zero and that every use leaves zero needs no fill per call (a fill
// before each split-KV decode cost about 3 us). It is private to one stream, so its uses are
// ordered by the stream; streams are told apart by Driver::stream_id, which is never reused.
// Memory is taken and given back in the stream's order (cuMemAllocAsync, cuMemFreeAsync), which
// another thread's graph capture allows.
class StreamZeros {
 public:
  // Streams that keep memory, for the runtime's life; further streams get none.
  static constexpr std::size_t kStreams = 64;

  StreamZeros() = default;
  ~StreamZeros();
  StreamZeros(const StreamZeros&) = delete;
  StreamZeros& operator=(const StreamZeros&) = delete;

  // At least `bytes` for the stream `id` (`stream` on `device` of `driver`), zero in the
  // stream's order; null when kStreams other streams keep memory. The caller holds the result
  // until the work that uses it is queued: memory outgrown by a later call on the same stream
  // goes back, in the stream's order, only once no caller holds it.
  std::shared_ptr<void> get(Driver& driver, int device, std::uint64_t id, std::size_t bytes,
                            void* stream);

 private:
  struct Memory;
  struct Block {
    std::shared_ptr<Memory> memory;
    std::size_t bytes = 0;
  };

  std::mutex mutex_;
  std::unordered_map<std::uint64_t, Block> blocks_;
};

}  // namespace kiln::detail
