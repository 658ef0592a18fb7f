// SPDX-License-Identifier: Apache-2.0
// Backends: compilers and drivers opened once per vendor, the backend's choice, and the device.
#include "backend/backends.hpp"

#include <fmt/format.h>

#include <string>
#include <utility>

#include "backend/compiler_library.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

// What a load without a device can do instead. NOTE: not "give a target": a load has one (or
// would take the device's), and that advice sent callers in circles.
std::string compile_only_fix() {
  return fmt::format("; to compile without loading, use {}", knob_name(Knob::compile_only));
}

}  // namespace

Backends::Backends(const Config& config, MemoStore& memos) : config_(config), memos_(memos) {
  backend_ = choose_backend();
}

LazyCompiler& Backends::compiler(Vendor vendor) {
  std::lock_guard lock(mutex_);
  auto& slot = compilers_[vendor];
  if (!slot.compiler && !slot.error) {
    try {
      auto lazy = std::make_unique<LazyCompiler>(compiler_library(vendor), memos_);
      lazy->identity();  // loads the library unless the memo vouches for it
      slot.compiler = std::move(lazy);
    } catch (...) {
      slot.error = std::current_exception();
    }
  }
  if (slot.error) std::rethrow_exception(slot.error);
  return *slot.compiler;
}

Driver* Backends::driver_for(Vendor vendor, std::string* why) {
  std::lock_guard lock(mutex_);
  auto& slot = drivers_[vendor];
  if (!slot.tried) {
    slot.tried = true;
    try {
      slot.driver = vendor == Vendor::amd ? open_hip_driver() : open_cuda_driver();
    } catch (const std::exception& e) {
      slot.error = e.what();
    }
  }
  if (why) *why = slot.error;
  return slot.driver.get();
}

Vendor Backends::choose_backend() {
  if (config_.backend) return *config_.backend;
  if (config_.target) return config_.target->vendor();
  for (const Vendor vendor : kVendors) {
    if (Driver* d = driver_for(vendor); d && d->device_count() > config_.device) return vendor;
  }
  for (const Vendor vendor : kVendors) {
    try {
      compiler(vendor);
      return vendor;
    } catch (const Error&) {
    }
  }
  return Vendor::nvidia;
}

const std::optional<Target>& Backends::device_target() {
  std::call_once(device_target_once_, [&] {
    Driver* d = driver();
    if (!d || d->device_count() <= config_.device) return;
    device_target_ = Target::parse(d->device(config_.device).target);
  });
  return device_target_;
}

Target Backends::default_target() {
  if (config_.target) return *config_.target;
  if (auto target = device_target()) return *target;
  const std::string missing = missing_device().value_or(fmt::format(
      "the {} driver does not name device {}'s target", to_string(backend_), config_.device));
  throw Error(ErrorCategory::not_found,
              fmt::format("{}, and no target is given: give {} (e.g. sm_90a, gfx90a) to "
                          "compile without a GPU",
                          missing, knob_name(Knob::target)));
}

const DeviceInfo& Backends::device_info() {
  std::call_once(device_info_once_, [&] {
    if (auto missing = missing_device()) throw Error(ErrorCategory::not_found, *missing);
    device_info_ = driver()->device(config_.device);
  });
  return device_info_;
}

std::optional<std::string> Backends::missing_device() {
  std::string why;
  Driver* d = driver(&why);
  if (!d) {
    return fmt::format("the {} driver is unavailable ({}), so there is no {} device {}",
                       to_string(backend_), why, to_string(backend_), config_.device);
  }
  if (d->device_count() <= config_.device) {
    return fmt::format("there is no {} device {} (the driver counts {})", to_string(backend_),
                       config_.device, d->device_count());
  }
  return std::nullopt;
}

Driver& Backends::device_driver(std::string_view doing, std::string_view fix) {
  if (auto missing = missing_device()) {
    throw Error(ErrorCategory::not_found, fmt::format("cannot {}: {}{}", doing, *missing, fix));
  }
  return *driver();
}

void Backends::require_device(std::string_view spec) {
  device_driver(fmt::format("load {}", spec), compile_only_fix());
}

void Backends::require_device(std::string_view spec, const Target& target) {
  require_device(spec);
  const auto& device = device_target();
  if (!device) {
    throw Error(ErrorCategory::not_found,
                fmt::format("cannot load {}: the {} driver does not name device {}'s target{}",
                            spec, to_string(backend_), config_.device, compile_only_fix()));
  }
  if (*device != target) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("cannot load {} on device {} whose target is {}: leave the spec's "
                            "target empty and {} unset, or compile for other targets without "
                            "loading ({})",
                            spec, config_.device, device->name(), knob_name(Knob::target),
                            knob_name(Knob::compile_only)));
  }
}

bool Backends::loads_on_device(const Target& target) {
  const auto& device = device_target();
  return device && *device == target;
}

}  // namespace kiln::detail
