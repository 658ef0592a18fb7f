// SPDX-License-Identifier: Apache-2.0
// Single-flight memoisation: one computation per key however many threads ask at once.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

#include "cache/key.hpp"

namespace kiln::detail {

template <class Value>
class SingleFlight {
 public:
  // The value for `key`. The first caller runs `make` (without any lock held); callers that
  // arrive meanwhile wait for it. A failure reaches every caller of that attempt and is
  // forgotten, so a later call tries again. `computed` tells whether this call ran `make`.
  template <class Make>
  Value get(const Key& key, Make&& make, bool* computed = nullptr) {
    std::shared_ptr<Slot> slot;
    bool owner = false;
    {
      std::lock_guard lock(mutex_);
      auto& entry = slots_[key];
      if (!entry) {
        entry = std::make_shared<Slot>();
        owner = true;
      }
      slot = entry;
    }
    if (computed) *computed = owner;
    if (owner) return fill(key, *slot, std::forward<Make>(make));
    std::unique_lock lock(slot->mutex);
    slot->ready.wait(lock, [&] { return slot->done; });
    if (slot->error) std::rethrow_exception(slot->error);
    return *slot->value;
  }

  std::optional<Value> find(const Key& key) const {
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard lock(mutex_);
      auto it = slots_.find(key);
      if (it == slots_.end()) return std::nullopt;
      slot = it->second;
    }
    std::lock_guard lock(slot->mutex);
    if (!slot->done || slot->error) return std::nullopt;
    return slot->value;
  }

 private:
  struct Slot {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
    std::optional<Value> value;
    std::exception_ptr error;
  };

  template <class Make>
  Value fill(const Key& key, Slot& slot, Make&& make) {
    try {
      Value value = make();
      {
        std::lock_guard lock(slot.mutex);
        slot.value = value;
        slot.done = true;
      }
      slot.ready.notify_all();
      return value;
    } catch (...) {
      {
        std::lock_guard lock(mutex_);
        slots_.erase(key);
      }
      {
        std::lock_guard lock(slot.mutex);
        slot.error = std::current_exception();
        slot.done = true;
      }
      slot.ready.notify_all();
      throw;
    }
  }

  mutable std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<Slot>, KeyHash> slots_;
};

}  // namespace kiln::detail
