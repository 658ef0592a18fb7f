// SPDX-License-Identifier: Apache-2.0
// Backends: each vendor's compiler and driver, opened once; the one that loads and launches; and
// the runtime's device.
#pragma once

#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "backend/backend.hpp"
#include "backend/lazy_compiler.hpp"
#include "core/config.hpp"
#include "kiln/runtime.hpp"
#include "kiln/target.hpp"

namespace kiln::detail {

// In the order a runtime looks for a device or a compiler.
inline constexpr Vendor kVendors[] = {Vendor::nvidia, Vendor::amd};

// NOTE: it owns the drivers, so whatever the drivers made (loaded kernels, device memory) must be
// destroyed before it: Runtime::Impl declares those after its Backends.
class Backends {
 public:
  // Chooses the backend: the configured one, else the configured target's vendor, else the first
  // vendor whose driver has the configured device, else the first whose compiler is found, else
  // nvidia. `config` and `memos` (where the compilers' fact memos are kept) must outlive it.
  Backends(const Config& config, MemoStore& memos);
  Backends(const Backends&) = delete;
  Backends& operator=(const Backends&) = delete;

  // The one that loads and launches.
  Vendor backend() const { return backend_; }

  // The compiler for a vendor. While its fact memo in `memos` still describes the installed
  // library, its answers come from there and computing a key loads nothing; the library is
  // loaded to compile. A failure to find it is remembered and rethrown.
  LazyCompiler& compiler(Vendor vendor);

  // The driver of the backend, or of `vendor`, opened at the first call; null (with the reason
  // in `why`) when absent.
  Driver* driver(std::string* why = nullptr) { return driver_for(backend_, why); }
  Driver* driver_for(Vendor vendor, std::string* why = nullptr);

  // The configured target, else the device's; kiln::Error (not_found) saying why neither is
  // there and how to compile without a GPU.
  Target default_target();

  // The device's target, when the backend has the configured device; asked of the driver once (a
  // query there cost 4.6 us, and every call checks its target).
  const std::optional<Target>& device_target();

  // The device, queried once: decode reads its SM count on every call. Throws kiln::Error
  // (not_found) whose message is missing_device()'s.
  const DeviceInfo& device_info();

  // Why the device cannot be used, the root cause first (a driver that did not load, before the
  // device it would have found); nothing when it can be.
  std::optional<std::string> missing_device();

  // The driver, when it has the device; otherwise kiln::Error (not_found) saying that it cannot
  // `doing`, why, and then `fix`.
  Driver& device_driver(std::string_view doing, std::string_view fix);

  // Throws kiln::Error (not_found), naming `spec` and how to compile without loading, unless
  // the device is there.
  void require_device(std::string_view spec);
  // And unless its target is `target`: (not_found) for a driver that does not name its target;
  // (invalid_argument) for another target.
  void require_device(std::string_view spec, const Target& target);

  // Whether a kernel built for `target` loads on the device.
  bool loads_on_device(const Target& target);

 private:
  struct CompilerSlot {
    std::unique_ptr<LazyCompiler> compiler;
    std::exception_ptr error;
  };
  struct DriverSlot {
    bool tried = false;
    std::unique_ptr<Driver> driver;
    std::string error;
  };

  Vendor choose_backend();

  const Config& config_;
  MemoStore& memos_;
  std::mutex mutex_;  // over compilers_ and drivers_
  std::map<Vendor, CompilerSlot> compilers_;
  std::map<Vendor, DriverSlot> drivers_;
  Vendor backend_;
  std::once_flag device_target_once_;
  std::optional<Target> device_target_;
  std::once_flag device_info_once_;
  DeviceInfo device_info_;
};

}  // namespace kiln::detail
