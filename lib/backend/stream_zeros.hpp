// Zero-filled device memory that each stream keeps from call to call (Runtime::stream_zeros).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>

#include "backend/backend.hpp"

namespace kiln::detail {

// NOTE: memory that starts zero and that every use leaves zero needs no fill per call (a fill
// before each split-KV decode cost about 3 us). It is private to one stream, so uses are
// ordered by the stream; streams are told apart by Driver::stream_id, which is never reused.
class StreamZeros {
 public:
  // Streams whose memory is kept; the least recently used beyond them gives its memory back.
  static constexpr std::size_t kStreams = 64;

  StreamZeros() = default;
  ~StreamZeros();
  StreamZeros(const StreamZeros&) = delete;
  StreamZeros& operator=(const StreamZeros&) = delete;

  // At least `bytes` for the stream `id` (`stream` on `device` of `driver`), zero in the
  // stream's order. Growing gives the old memory back once the device is done with it.
  void* get(Driver& driver, int device, std::uint64_t id, std::size_t bytes, void* stream);

 private:
  struct Block {
    void* pointer = nullptr;
    std::size_t bytes = 0;
    std::list<std::uint64_t>::iterator recent;  // its place in recent_
  };

  void release(const Block& block);

  std::mutex mutex_;
  Driver* driver_ = nullptr;  // of every block: a runtime has one device and one driver
  int device_ = 0;
  std::unordered_map<std::uint64_t, Block> blocks_;
  std::list<std::uint64_t> recent_;  // stream ids, most recently used first
};

}  // namespace kiln::detail
