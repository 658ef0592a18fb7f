// SPDX-License-Identifier: Apache-2.0
// kiln::Runtime: spec -> cached, compiled, loaded kernel; warm-up; statistics.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/error.hpp"
#include "kiln/spec.hpp"
#include "kiln/target.hpp"

namespace kiln {

enum class JitMode {
  on,      // compile on a miss
  strict,  // a miss on the hot path (Runtime::kernel) is an error; warm-up still compiles
  off,     // never compile; only memory and disk hits
};

enum class LogLevel { error, warn, info, debug };

// Everything here overrides the matching KILN_* environment variable (README, "Knobs").
struct Options {
  std::optional<std::string> backend;  // "cuda" or "hip"; default: what is installed
  std::optional<std::string> target;   // "sm_90a", "gfx90a"; default: the device's
  std::optional<std::filesystem::path> kernels_dir;
  std::optional<std::filesystem::path> cache_dir;  // an empty path: none, memory-only
  std::optional<std::vector<std::filesystem::path>> cache_ro_dirs;
  // Load from the read-only tiers whatever their directories' owners and modes; default:
  // KILN_CACHE_RO_TRUST=1 (README, "Disk cache").
  std::optional<bool> cache_ro_trust;
  std::optional<std::uint64_t> cache_max_bytes;  // 0: no cap
  std::optional<JitMode> jit;
  std::optional<LogLevel> log_level;
  std::optional<std::filesystem::path> dump_dir;
  // A manifest to append each spec kernel() is asked for to, once per Runtime, one canonical
  // spec a line as `kiln warm FILE` reads; default: KILN_RECORD (README, "Knobs").
  std::optional<std::filesystem::path> record;
  // Ops check what is costly to check (page tables against the cache) on the host before each
  // launch, with a synchronizing copy; default: KILN_DEBUG=1.
  std::optional<bool> debug;
  int device = 0;
};

struct Dim3 {
  std::uint32_t x = 1, y = 1, z = 1;
};

struct LaunchConfig {
  Dim3 grid;
  Dim3 block;
  std::uint32_t shared_bytes = 0;  // dynamic shared memory; above 48 KB the limit is raised
  void* stream = nullptr;          // CUstream or hipStream_t; null: the default stream
  // Programmatic dependent launch (CUDA, sm_90 and newer, a driver with cuLaunchKernelEx): the
  // kernel may be scheduled while the one before it on the stream is finishing, so it must run
  // `griddepcontrol.wait` (wait_for_previous_grid in kernels_src/common/vendor.cuh) before it
  // touches global memory, reads or writes. Elsewhere, or if the driver refuses, a plain launch.
  bool overlap_previous = false;
};

// What the compiler said about one kernel. -1 where the backend does not report it.
struct KernelInfo {
  std::string key;           // 32 hex digits
  std::string spec;          // canonical spec
  std::string target;        // sm_90a, gfx90a
  std::string compiler;      // "nvrtc 13.0"
  std::string lowered_name;  // the symbol in the binary
  int registers = -1;
  int spill_bytes = -1;   // spill stores + spill loads
  int shared_bytes = -1;  // static shared memory
  int stack_bytes = -1;
  double compile_ms = 0;
  std::string log;
};

namespace detail {
struct LoadedKernel;
struct RuntimeAccess;  // lib/runtime/device_calls.hpp: what only the ops ask of a Runtime
}  // namespace detail

// A loaded kernel: cheap to copy, valid for the life of the Runtime that made it.
class Kernel {
 public:
  Kernel() = default;

  // `params` is the family's Params struct; its size is checked against the compiled one.
  template <class Params>
  void launch(const LaunchConfig& config, const Params& params) const {
    launch_raw(config, &params, sizeof(Params));
  }
  void launch_raw(const LaunchConfig& config, const void* params, std::size_t size) const;

  const KernelInfo& info() const;
  explicit operator bool() const noexcept { return loaded_ != nullptr; }

 private:
  friend class Runtime;
  explicit Kernel(std::shared_ptr<detail::LoadedKernel> loaded) : loaded_(std::move(loaded)) {}
  std::shared_ptr<detail::LoadedKernel> loaded_;
};

enum class WarmupStatus { memory_hit, disk_hit, compiled, failed };
std::string_view to_string(WarmupStatus status) noexcept;

struct WarmupItem {
  std::string spec;  // canonical
  std::string key;
  WarmupStatus status = WarmupStatus::failed;
  double ms = 0;                          // wall time for this item: lookup, compile and load
  std::string error;                      // the failure's message, when status is failed
  std::optional<ErrorCategory> category;  // the failure's, when it was a kiln::Error
};

struct WarmupProgress {
  std::size_t done = 0;
  std::size_t total = 0;
  const WarmupItem* last = nullptr;  // the item that just finished
};

struct WarmupOptions {
  int threads = 0;  // 0: one per hardware thread
  // Load each kernel on the runtime's device as well, when the spec targets it and a device is
  // present, so the hot path then finds it in memory.
  bool load = true;
  // Called once per spec as it finishes (failed ones too), with `done` counting up from 1 to
  // `total`: calls come one at a time, under a lock, but from whichever warm-up thread finished
  // the spec, so what it touches besides its argument must be safe to use from those threads. It
  // must not call warmup() again; the item it is shown lives until warmup() returns.
  std::function<void(const WarmupProgress&)> on_progress;
};

struct WarmupReport {
  std::vector<WarmupItem> items;  // in the order of the specs given
  double wall_ms = 0;
  std::size_t count(WarmupStatus status) const;
  bool ok() const { return count(WarmupStatus::failed) == 0; }
};

struct Stats {
  std::uint64_t memory_hits = 0;
  std::uint64_t disk_hits = 0;
  std::uint64_t compiles = 0;
  std::uint64_t compile_failures = 0;
  std::uint64_t loads = 0;
  double compile_ms = 0;
  double load_ms = 0;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  std::string target;  // sm_90a, gfx90a
  int multiprocessors = 0;
  std::uint64_t memory_bytes = 0;
  // What one CTA may take: threads, and dynamic shared memory in bytes (CUDA: the opt-in
  // maximum). 0 where the driver does not say.
  int max_threads_per_block = 0;
  int max_shared_bytes_per_block = 0;
};

struct BackendInfo {
  std::string name;      // "cuda", "hip"
  std::string compiler;  // "nvrtc 13.0", or why it is missing
  bool compiler_found = false;
  std::string driver;  // "cuda driver 13.0", or why it is missing
  bool driver_found = false;
  std::vector<DeviceInfo> devices;
};

struct RuntimeInfo {
  std::string backend;  // the one that loads and launches
  std::string target;   // default target, empty when none can be chosen
  std::vector<BackendInfo> backends;
  std::filesystem::path kernels_dir;  // empty: the copy embedded in the library
  std::filesystem::path cache_dir;    // empty: memory-only
  std::vector<std::filesystem::path> cache_ro_dirs;
  JitMode jit = JitMode::on;
};

class Runtime {
 public:
  explicit Runtime(Options options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // The hot path: a memory hit, else a disk hit, else a compile (as KILN_JIT allows); then
  // loaded on the runtime's device. Thread-safe; one compile per key however many threads ask.
  // `stream` is the one the kernel will be launched on: while it captures a graph, where
  // loading a module is illegal, a kernel not loaded yet is an error that names its spec.
  Kernel kernel(const KernelSpec& spec, void* stream = nullptr);

  // Compiles (or finds on disk) without loading: works with no device, for any target whose
  // compiler is installed.
  KernelInfo compile(const KernelSpec& spec);

  WarmupReport warmup(std::span<const KernelSpec> specs, const WarmupOptions& options = {});

  std::string key(const KernelSpec& spec);               // 32 hex digits
  std::string generated_source(const KernelSpec& spec);  // the unit handed to the compiler

  RuntimeInfo info() const;
  Stats stats() const;
  // The default target, parsed once: Options::target, else the device's; throws kiln::Error
  // (not_found) when none can be chosen.
  Target target() const;
  int device() const;      // the device ordinal kernels load on (Options::device)
  Vendor backend() const;  // the one that loads and launches (to_string: "cuda")
  // Of device(), queried once; throws kiln::Error (not_found) when there is none.
  const DeviceInfo& device_info() const;

 private:
  friend struct detail::RuntimeAccess;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The most device ordinals that get a process-wide runtime: 0 to kMaxDefaultRuntimes - 1.
inline constexpr int kMaxDefaultRuntimes = 64;

// The process-wide runtime of device ordinal `device`, built from the environment with
// Options::device = `device` on first use; thread-safe, one per device, never destroyed. The C
// API takes each call's from its tensors' device, so threads or processes driving different
// GPUs each use their own.
Runtime& default_runtime(int device);

// Device 0's process-wide runtime: the one the C++ ops use when given none.
Runtime& default_runtime();

}  // namespace kiln
