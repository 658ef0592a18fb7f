// SPDX-License-Identifier: Apache-2.0
// kiln::Runtime: spec -> unit -> memory, disk or compile -> loaded kernel.
#include "kiln/runtime.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "backend/backends.hpp"
#include "backend/stream_zeros.hpp"
#include "cache/disk.hpp"
#include "core/config.hpp"
#include "core/elapsed.hpp"
#include "core/log.hpp"
#include "jit/recorder.hpp"
#include "jit/sources.hpp"
#include "jit/unit.hpp"
#include "kiln/error.hpp"
#include "kiln/target.hpp"
#include "runtime/device_calls.hpp"
#include "runtime/disk_memos.hpp"
#include "runtime/kernel_store.hpp"

namespace kiln {

using detail::Clock;
using detail::Config;
using detail::Driver;
using detail::ms_since;
using detail::Unit;

namespace {

// The runtime's configuration, with this process's log level set from it before anything that
// logs (the source tree, the disk cache, the backends) is opened.
Config configure(const Options& options) {
  Config config = detail::resolve_config(options);
  detail::set_log_level(config.log_level);
  return config;
}

// The target of a spec, named by it in the error when it names none.
Target target_of(const KernelSpec& spec) {
  try {
    return Target(spec.target);
  } catch (const Error& e) {
    throw Error(e.category(), fmt::format("{}: {}", to_string(spec), e.what()));
  }
}

}  // namespace

struct Runtime::Impl {
  explicit Impl(const Options& options)
      : config(configure(options)),
        sources(detail::SourceTree::locate(config.kernels_dir)),
        disk(detail::DiskCacheConfig{config.cache_dir, config.cache_ro_dirs, config.cache_max_bytes,
                                     config.cache_ro_trust}),
        memos(disk),
        backends(config, memos),
        kernels(config, sources, disk, backends),
        recorder(config.record) {
    detail::log(LogLevel::info, "runtime: backend {}, kernels from {}, cache {}",
                to_string(backends.backend()), sources.describe(),
                disk.writable() ? disk.root()->string() : std::string("memory-only"));
  }

  // The target `spec` compiles for: its own, else the configured one, else the device's.
  Target target_for(const KernelSpec& spec) {
    return spec.target.empty() ? backends.default_target() : target_of(spec);
  }

  Unit unit_of(const KernelSpec& spec) {
    const Target target = target_for(spec);
    return detail::make_unit(spec, target, sources, backends.compiler(target.vendor()));
  }

  Config config;
  detail::SourceTree sources;
  detail::DiskCache disk;
  detail::DiskMemos memos;
  // NOTE: declared after `memos`, where the compilers keep their fact memos, and before what the
  // drivers made (stream zeros' memory, loaded kernels), which must go back while they are open.
  detail::Backends backends;
  detail::StreamZeros stream_zeros;
  detail::KernelStore kernels;
  detail::Recorder recorder;
};

Runtime::Runtime(Options options) : impl_(std::make_unique<Impl>(options)) {}
Runtime::~Runtime() = default;

Kernel Runtime::kernel(const KernelSpec& spec, void* stream) {
  if (auto kernel = impl_->kernels.find(spec)) return Kernel(std::move(kernel));
  // NOTE: a spec without a target takes the device's. Without a device, unit_of would advise
  // giving a target, which compiles but cannot make this load: say what is missing instead.
  if (spec.target.empty() && !impl_->config.target) {
    impl_->backends.require_device(to_string(spec));
  }
  const Unit unit = impl_->unit_of(spec);
  impl_->recorder.record(unit);
  return Kernel(impl_->kernels.load(spec, unit, stream));
}

KernelInfo Runtime::compile(const KernelSpec& spec) {
  return impl_->kernels.compile(impl_->unit_of(spec));
}

WarmupReport Runtime::warmup(std::span<const KernelSpec> specs, const WarmupOptions& options) {
  const auto start = Clock::now();
  WarmupReport report;
  report.items.resize(specs.size());
  std::atomic<std::size_t> next{0};
  std::size_t done = 0;
  std::mutex progress_mutex;
  const detail::Interface interface = detail::current_interface();
  auto work = [&] {
    // Its failures are the caller's messages, naming the caller's knobs.
    const detail::InterfaceScope scope(interface);
    for (std::size_t i = next.fetch_add(1); i < specs.size(); i = next.fetch_add(1)) {
      WarmupItem& item = report.items[i];
      const auto item_start = Clock::now();
      item.spec = to_string(specs[i]);
      try {
        const Unit unit = impl_->unit_of(specs[i]);
        item.spec = unit.spec;
        item.key = unit.key.hex();
        item.status = impl_->kernels.warm(unit, options.load);
      } catch (const Error& e) {
        item.status = WarmupStatus::failed;
        item.error = e.what();
        item.category = e.category();
      } catch (const std::exception& e) {
        item.status = WarmupStatus::failed;
        item.error = e.what();
      }
      item.ms = ms_since(item_start);
      std::lock_guard lock(progress_mutex);
      ++done;
      if (options.on_progress) options.on_progress({done, specs.size(), &item});
    }
  };
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t threads = std::min<std::size_t>(
      options.threads > 0 ? static_cast<std::size_t>(options.threads) : hardware,
      std::max<std::size_t>(1, specs.size()));
  std::vector<std::jthread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  pool.clear();
  report.wall_ms = ms_since(start);
  return report;
}

std::string Runtime::key(const KernelSpec& spec) {
  return impl_->unit_of(spec).key.hex();
}

std::string Runtime::generated_source(const KernelSpec& spec) {
  return impl_->unit_of(spec).source;
}

Target Runtime::target() const {
  return impl_->backends.default_target();
}

int Runtime::device() const {
  return impl_->config.device;
}

Vendor Runtime::backend() const {
  return impl_->backends.backend();
}

const DeviceInfo& Runtime::device_info() const {
  return impl_->backends.device_info();
}

struct detail::RuntimeAccess {
  static Runtime::Impl& impl(const Runtime& runtime) { return *runtime.impl_; }
};

namespace detail {

void require_loadable(Runtime& runtime, const KernelSpec& spec) {
  auto& impl = RuntimeAccess::impl(runtime);
  if (!impl.backends.device_target()) return;
  KernelSpec targeted = spec;
  const Target target = impl.target_for(spec);
  targeted.target = target.name();  // as the unit names it (make_unit)
  impl.backends.require_device(to_string(targeted), target);
}

void* allocate_async(Runtime& runtime, std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  auto& impl = RuntimeAccess::impl(runtime);
  return impl.backends.device_driver("allocate device memory", "")
      .allocate_async(impl.config.device, bytes, stream);
}

void free_async(Runtime& runtime, void* pointer, void* stream) {
  if (pointer == nullptr) return;
  auto& impl = RuntimeAccess::impl(runtime);
  impl.backends.device_driver("free device memory", "")
      .free_async(impl.config.device, pointer, stream);
}

void zero_async(Runtime& runtime, void* pointer, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  auto& impl = RuntimeAccess::impl(runtime);
  impl.backends.device_driver("zero device memory", "")
      .zero_async(impl.config.device, pointer, bytes, stream);
}

void encode_tensor_map(Runtime& runtime, void* map, const TensorMapLayout& layout) {
  RuntimeAccess::impl(runtime)
      .backends.device_driver("make a TMA descriptor", "")
      .encode_tensor_map(map, layout);
}

std::shared_ptr<void> stream_zeros(Runtime& runtime, std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  auto& impl = RuntimeAccess::impl(runtime);
  Driver& d = impl.backends.device_driver("allocate device memory", "");
  const int device = impl.config.device;
  // NOTE: capture first: the driver refuses to name a capturing stream.
  if (d.is_capturing(device, stream)) return nullptr;
  const std::optional<std::uint64_t> id = d.stream_id(device, stream);
  return id ? impl.stream_zeros.get(d, device, *id, bytes, stream) : nullptr;
}

void copy_to_host(Runtime& runtime, void* host, const void* device_pointer, std::size_t bytes,
                  void* stream) {
  if (bytes == 0) return;
  auto& impl = RuntimeAccess::impl(runtime);
  impl.backends.device_driver("copy device memory to the host", "")
      .copy_to_host(impl.config.device, host, device_pointer, bytes, stream);
}

bool debug(const Runtime& runtime) {
  return RuntimeAccess::impl(runtime).config.debug;
}

}  // namespace detail

RuntimeInfo Runtime::info() const {
  RuntimeInfo info;
  info.backend = to_string(impl_->backends.backend());
  try {
    info.target = impl_->backends.default_target().name();
  } catch (const Error&) {
  }
  for (const Vendor vendor : detail::kVendors) {
    BackendInfo backend;
    backend.name = to_string(vendor);
    try {
      backend.compiler = impl_->backends.compiler(vendor).identity();
      backend.compiler_found = true;
    } catch (const std::exception& e) {
      backend.compiler = e.what();
    }
    std::string why;
    if (Driver* d = impl_->backends.driver_for(vendor, &why)) {
      backend.driver_found = true;
      backend.driver = d->version();
      for (int i = 0; i < d->device_count(); ++i) backend.devices.push_back(d->device(i));
    } else {
      backend.driver = why;
    }
    info.backends.push_back(std::move(backend));
  }
  info.kernels_dir = impl_->sources.root();
  if (impl_->disk.writable()) info.cache_dir = *impl_->disk.root();
  info.cache_ro_dirs = impl_->disk.ro_roots();
  info.jit = impl_->config.jit;
  return info;
}

Stats Runtime::stats() const {
  return impl_->kernels.stats();
}

void Kernel::launch_raw(const LaunchConfig& config, const void* params, std::size_t size) const {
  if (!loaded_) {
    throw Error(ErrorCategory::invalid_argument,
                "launch of an empty kiln::Kernel: get one from Runtime::kernel first");
  }
  if (size != loaded_->params_size) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("{} takes a {}-byte Params struct but launch got {} bytes: pass the "
                            "family's Params struct from <kiln/params/...>",
                            loaded_->info.spec, loaded_->params_size, size));
  }
  loaded_->function->launch(config, params);
}

const KernelInfo& Kernel::info() const {
  if (!loaded_) {
    throw Error(ErrorCategory::invalid_argument, "info() of an empty kiln::Kernel");
  }
  return loaded_->info;
}

std::string_view to_string(WarmupStatus status) noexcept {
  switch (status) {
    case WarmupStatus::memory_hit: return "memory";
    case WarmupStatus::disk_hit: return "disk";
    case WarmupStatus::compiled: return "compiled";
    case WarmupStatus::failed: return "failed";
  }
  return "?";
}

std::size_t WarmupReport::count(WarmupStatus status) const {
  return static_cast<std::size_t>(std::count_if(
      items.begin(), items.end(), [&](const WarmupItem& item) { return item.status == status; }));
}

Runtime& default_runtime(int device) {
  if (device < 0 || device >= kMaxDefaultRuntimes) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("device {} has no process-wide runtime: device ordinals run from 0 "
                            "to {}",
                            device, kMaxDefaultRuntimes - 1));
  }
  // Never destroyed: kernels may still be launched from other static destructors, and the
  // driver may already be gone at exit. NOTE: a lock only to create one, so that threads driving
  // different devices do not contend on every call.
  static std::array<std::atomic<Runtime*>, kMaxDefaultRuntimes> runtimes{};
  static std::mutex create_mutex;
  std::atomic<Runtime*>& slot = runtimes[static_cast<std::size_t>(device)];
  if (Runtime* runtime = slot.load(std::memory_order_acquire)) return *runtime;
  std::lock_guard lock(create_mutex);
  if (Runtime* runtime = slot.load(std::memory_order_relaxed)) return *runtime;
  Options options;
  options.device = device;
  auto* runtime = new Runtime(options);
  slot.store(runtime, std::memory_order_release);
  return *runtime;
}

Runtime& default_runtime() {
  return default_runtime(0);
}

}  // namespace kiln
