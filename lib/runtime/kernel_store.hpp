// SPDX-License-Identifier: Apache-2.0
// KernelStore: kernels from memory, the disk cache or a compile, loaded on the runtime's device.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "backend/backend.hpp"
#include "backend/backends.hpp"
#include "cache/disk.hpp"
#include "cache/single_flight.hpp"
#include "core/config.hpp"
#include "jit/sources.hpp"
#include "jit/unit.hpp"
#include "kiln/runtime.hpp"
#include "kiln/spec.hpp"

namespace kiln::detail {

// A kernel loaded on the runtime's device: what a kiln::Kernel holds.
struct LoadedKernel {
  KernelInfo info;
  std::unique_ptr<Function> function;
  std::size_t params_size = 0;
};

// NOTE: its loaded kernels hold modules of the backend's driver, so it must be destroyed before
// `backends` (backends.hpp).
class KernelStore {
 public:
  // All four must outlive it; `sources` makes a unit again for the real compiler.
  KernelStore(const Config& config, const SourceTree& sources, DiskCache& disk, Backends& backends);
  KernelStore(const KernelStore&) = delete;
  KernelStore& operator=(const KernelStore&) = delete;

  // The hot path's memory hit: the kernel that load() gave for `spec` as the caller wrote it
  // (hashed, not printed), or null.
  std::shared_ptr<LoadedKernel> find(const KernelSpec& spec) {
    std::shared_lock lock(by_spec_mutex_);
    const auto it = by_spec_.find(spec);
    if (it == by_spec_.end()) return nullptr;
    memory_hits_.fetch_add(1, std::memory_order_relaxed);
    return it->second;
  }

  // The hot path's miss: `unit`, made from `spec`, from memory, disk or a compile (as KILN_JIT
  // allows on the hot path), loaded; from then on find(spec) gives it. `stream` is the launch's:
  // while it captures a graph, a kernel not loaded yet is an error.
  std::shared_ptr<LoadedKernel> load(const KernelSpec& spec, const Unit& unit, void* stream);

  // `unit` from memory, disk or a compile, without loading: works with no device.
  KernelInfo compile(const Unit& unit) { return compiled(unit).first; }

  // `unit` from memory, disk or a compile, then loaded on the device too when `load` is set and
  // the unit targets the device; how it was found.
  WarmupStatus warm(const Unit& unit, bool load);

  Stats stats() const;

 private:
  struct Obtained;

  // Memory, then disk, then compile; a disk entry the driver rejects is rebuilt, never trusted.
  // `hot_path`: Runtime::kernel asks, and `stream` is its launch stream.
  std::pair<std::shared_ptr<LoadedKernel>, WarmupStatus> loaded(const Unit& unit, bool hot_path,
                                                                void* stream = nullptr);
  std::pair<KernelInfo, WarmupStatus> compiled(const Unit& unit);
  // Disk, then (under the key's disk lock) disk again, then compile and store.
  Obtained obtain(const Unit& unit, bool hot_path);
  Obtained disk_hit(Entry entry);  // counted here and in the cache's tally
  Entry compile_unit(const Unit& asked, bool hot_path);
  std::string dump(const Unit& unit, const CompileResult& result);
  static std::string dump_failure(const Unit& unit);
  std::shared_ptr<LoadedKernel> load_entry(const Unit& unit, const Entry& entry);

  const Config& config_;
  const SourceTree& sources_;
  DiskCache& disk_;
  Backends& backends_;

  SingleFlight<std::shared_ptr<LoadedKernel>> memory_;
  SingleFlight<KernelInfo> on_disk_;
  // The hot path's shortcut: spec as the caller wrote it -> loaded kernel.
  std::shared_mutex by_spec_mutex_;
  std::unordered_map<KernelSpec, std::shared_ptr<LoadedKernel>> by_spec_;

  std::atomic<std::uint64_t> memory_hits_{0}, disk_hits_{0}, compiles_{0}, compile_failures_{0},
      loads_{0}, compile_us_{0}, load_us_{0};
};

}  // namespace kiln::detail
