// kiln::Runtime: spec -> unit -> memory, disk or compile -> loaded kernel.
#include "kiln/runtime.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "backend/backend.hpp"
#include "backend/backends.hpp"
#include "backend/stream_zeros.hpp"
#include "cache/disk.hpp"
#include "cache/single_flight.hpp"
#include "config.hpp"
#include "jit/sources.hpp"
#include "jit/unit.hpp"
#include "kiln/error.hpp"
#include "kiln/target.hpp"
#include "log.hpp"

namespace kiln {
namespace detail {

struct LoadedKernel {
  KernelInfo info;
  std::unique_ptr<Function> function;
  std::size_t params_size = 0;
};

}  // namespace detail

using detail::Compiler;
using detail::Config;
using detail::Driver;
using detail::Entry;
using detail::Key;
using detail::LoadedKernel;
using detail::Unit;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

KernelInfo info_of(const Entry& entry) {
  KernelInfo info;
  info.key = entry.key.hex();
  info.spec = entry.meta.spec;
  info.target = entry.meta.target;
  info.compiler = entry.meta.compiler;
  info.lowered_name = entry.meta.lowered_name;
  info.registers = entry.meta.registers;
  info.spill_bytes = entry.meta.spill_bytes;
  info.shared_bytes = entry.meta.shared_bytes;
  info.stack_bytes = entry.meta.stack_bytes;
  info.compile_ms = entry.meta.compile_ms;
  info.log = entry.meta.log;
  return info;
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text;
}

void write_text(const std::filesystem::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) detail::warn_once(path.string(), fmt::format("cannot write {}", path.string()));
}

// Appends `line` and a newline to the file at `path` with one write() on an O_APPEND descriptor,
// so that lines from concurrent threads and processes never interleave. A new file is 0644, as
// cache entries are: readable by all, writable by its owner only, since `kiln warm` compiles
// what it lists. A failure is one warning per file: recording never fails a call.
void append_line(const std::filesystem::path& path, std::string_view line) {
  const std::string text = std::string(line) + '\n';
  int error = 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = errno;
  } else {
    const ssize_t wrote = ::write(fd, text.data(), text.size());
    if (wrote < 0) error = errno;
    if (wrote >= 0 && static_cast<std::size_t>(wrote) != text.size()) error = ENOSPC;
    ::close(fd);
  }
  if (error != 0) {
    detail::warn_once("record " + path.string(),
                      fmt::format("cannot append to the spec record {}: {}; calls go on "
                                  "unrecorded (point KILN_RECORD at a file you can write)",
                                  path.string(), std::strerror(error)));
  }
}

// Writes `text` to `path` (its directory created) through a temp file renamed over it, so that a
// reader never sees half of it; failures warn once, as append_line's.
void write_record_file(const std::filesystem::path& path, std::string_view text) {
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  const std::filesystem::path temp = path.string() + fmt::format(".{}.tmp", ::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) std::filesystem::rename(temp, path, ec);
  if (ec) {
    std::filesystem::remove(temp);
    detail::warn_once("record " + path.string(),
                      fmt::format("cannot write the variant code {} beside the spec record: {}; "
                                  "its specs are recorded but will not warm (point KILN_RECORD at "
                                  "a file in a directory you can write)",
                                  path.string(), ec.message()));
  }
}

// An entry found on disk or compiled, and how it was obtained.
struct Obtained {
  Entry entry;
  WarmupStatus status;
};

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
        backends(config, disk) {
    detail::log(LogLevel::info, "runtime: backend {}, kernels from {}, cache {}",
                to_string(backends.backend()), sources.describe(),
                disk.writable() ? disk.root()->string() : std::string("memory-only"));
  }

  // --- spec -> unit -> entry ----------------------------------------------------------------

  Unit unit_of(const KernelSpec& spec) {
    const Target target = spec.target.empty() ? backends.default_target() : target_of(spec);
    return detail::make_unit(spec, target, sources, backends.compiler(target.vendor()));
  }

  // `hot_path`: the compile stalls a call (Runtime::kernel), so it is said at the default level.
  Entry compile_unit(const Unit& asked, bool hot_path) {
    if (config.jit == JitMode::off) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("{} (key {}) is not cached and KILN_JIT=off forbids compiling: "
                              "warm the cache where compiling is allowed, or set KILN_JIT=on",
                              asked.spec, asked.key.hex()));
    }
    const Compiler& c = backends.compiler(asked.target.vendor()).real();
    // NOTE: `asked` was keyed with the fact memo's answers. A binary must be stored under the
    // key its own compiler gives, and built with that compiler's options, so the unit is made
    // again from the real compiler (0.1 ms beside a compile): the same key, unless the memo was
    // out of date, which loading the compiler has just corrected.
    const Unit unit = detail::make_unit(asked.kernel, asked.target, sources, c);
    if (unit.key != asked.key) {
      detail::log(LogLevel::info,
                  "{} is stored under key {}, not {}: the compiler memo or a "
                  "source changed since that key was computed",
                  unit.spec, unit.key.hex(), asked.key.hex());
    }
    const detail::CompileResult result = c.compile({
        .name = fmt::format("kiln_{}.cu", unit.key.hex()),
        .source = unit.source,
        .headers = unit.headers,
        .options = unit.options,
        .name_expression = unit.name_expression,
    });
    stats_compiles.fetch_add(1);
    add(stats_compile_us, result.ms);
    const std::string dumped = dump(unit, result);
    if (!result.ok) {
      stats_compile_failures.fetch_add(1);
      throw CompileError({result.log, unit.spec, join(unit.options), unit.key.hex(),
                          dumped.empty() ? dump_failure(unit) : dumped});
    }
    const std::string details = fmt::format("key {}, {} registers, {} spill bytes", unit.key.hex(),
                                            result.usage.registers, result.usage.spill_bytes);
    if (hot_path) {
      // NOTE: a JIT of seconds inside a call looks like a hang to whoever runs the process.
      detail::note(fmt::format(
          "compiled {} in {:.0f} ms, inside the call that first needed it ({}); to compile "
          "ahead of time, list a run's specs with KILN_RECORD=FILE and warm them with `kiln "
          "warm FILE`",
          unit.spec, result.ms, details));
    } else {
      detail::log(LogLevel::info, "compiled {} in {:.0f} ms ({})", unit.spec, result.ms, details);
    }
    Entry entry;
    entry.key = unit.key;
    entry.binary = result.binary;
    entry.meta = {unit.spec,
                  unit.target.name(),
                  unit.compiler,
                  result.lowered_name,
                  result.ms,
                  result.usage.registers,
                  result.usage.spill_bytes,
                  result.usage.shared_bytes,
                  result.usage.stack_bytes,
                  result.log};
    return entry;
  }

  // KILN_DUMP_DIR: the generated unit, log, intermediate and binary of each compile.
  std::string dump(const Unit& unit, const detail::CompileResult& result) {
    if (!config.dump_dir) return {};
    std::error_code ec;
    std::filesystem::create_directories(*config.dump_dir, ec);
    const auto base = *config.dump_dir / unit.key.hex();
    const auto source = base.string() + ".cu";
    write_text(source, unit.source);
    write_text(base.string() + ".log", result.log);
    if (!result.intermediate.empty()) write_text(base.string() + ".ptx", result.intermediate);
    if (!result.binary.empty()) {
      write_text(base.string() + (unit.target.amd() ? ".co" : ".cubin"),
                 {reinterpret_cast<const char*>(result.binary.data()), result.binary.size()});
    }
    return source;
  }

  // With no dump directory, a failed compile still leaves its unit where a person can read it.
  static std::string dump_failure(const Unit& unit) {
    std::error_code ec;
    const auto path =
        std::filesystem::temp_directory_path(ec) / fmt::format("kiln_{}.cu", unit.key.hex());
    if (ec) return {};
    write_text(path, unit.source);
    return path.string();
  }

  Obtained obtain(const Unit& unit, bool hot_path) {
    if (auto entry = disk.load(unit.key, unit.spec)) {
      stats_disk_hits.fetch_add(1);
      return {std::move(*entry), WarmupStatus::disk_hit};
    }
    if (hot_path && config.jit == JitMode::strict) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("{} (key {}) is not cached and KILN_JIT=strict forbids compiling on "
                              "the hot path: warm it first ({}), or set KILN_JIT=on",
                              unit.spec, unit.key.hex(), detail::knob_name(detail::Knob::warmup)));
    }
    // Another process may be compiling the same key: wait for it, then look again.
    const auto lock = disk.lock(unit.key);
    if (auto entry = disk.load(unit.key, unit.spec)) {
      stats_disk_hits.fetch_add(1);
      return {std::move(*entry), WarmupStatus::disk_hit};
    }
    Entry entry = compile_unit(unit, hot_path);
    disk.store(entry);
    return {std::move(entry), WarmupStatus::compiled};
  }

  std::shared_ptr<LoadedKernel> load_entry(const Unit& unit, const Entry& entry) {
    Driver* d = backends.driver();
    const auto start = Clock::now();
    auto loaded = std::make_shared<LoadedKernel>();
    loaded->function = d->load(config.device, entry.binary, entry.meta.lowered_name);
    loaded->info = info_of(entry);
    loaded->params_size = unit.params->size;
    stats_loads.fetch_add(1);
    add(stats_load_us, ms_since(start));
    return loaded;
  }

  // Memory, then disk, then compile; a disk entry the driver rejects is rebuilt, never trusted.
  // `stream`: the hot path's launch stream, checked for graph capture before anything loads.
  std::pair<std::shared_ptr<LoadedKernel>, WarmupStatus> loaded(const Unit& unit, bool hot_path,
                                                                void* stream = nullptr) {
    backends.require_device(unit.spec, unit.target);
    bool computed = false;
    WarmupStatus status = WarmupStatus::memory_hit;
    auto kernel = memory.get(
        unit.key,
        [&] {
          if (hot_path && backends.driver()->is_capturing(config.device, stream)) {
            throw Error(
                ErrorCategory::invalid_argument,
                fmt::format("not warmed: {} (key {}) is not loaded, and its stream is "
                            "capturing a graph, during which no kernel can be loaded or "
                            "compiled: warm these specs before capturing ({}; after "
                            "`kiln warm`, one uncaptured call loads them), or make one "
                            "uncaptured call with the same shapes first",
                            unit.spec, unit.key.hex(), detail::knob_name(detail::Knob::warmup)));
          }
          Obtained found = obtain(unit, hot_path);
          status = found.status;
          try {
            return load_entry(unit, found.entry);
          } catch (const Error& e) {
            if (found.status != WarmupStatus::disk_hit) throw;
            detail::warn_once(unit.key.hex(),
                              fmt::format("cached {} (key {}) did not load ({}); recompiling",
                                          unit.spec, unit.key.hex(), e.what()));
            disk.remove(unit.key);
            Entry rebuilt = compile_unit(unit, hot_path);
            disk.store(rebuilt);
            status = WarmupStatus::compiled;
            return load_entry(unit, rebuilt);
          }
        },
        &computed);
    if (!computed) stats_memory_hits.fetch_add(1);
    return {kernel, computed ? status : WarmupStatus::memory_hit};
  }

  std::pair<KernelInfo, WarmupStatus> compiled(const Unit& unit) {
    if (auto kernel = memory.find(unit.key)) return {(*kernel)->info, WarmupStatus::memory_hit};
    bool computed = false;
    WarmupStatus status = WarmupStatus::disk_hit;
    KernelInfo info = on_disk.get(
        unit.key,
        [&] {
          Obtained found = obtain(unit, false);
          status = found.status;
          return info_of(found.entry);
        },
        &computed);
    return {info, computed ? status : WarmupStatus::memory_hit};
  }

  // KILN_RECORD: the first time kernel() is asked for `unit`, whether or not it then loads (so
  // that a run refused under KILN_JIT=strict still names what to warm). A user variant's code
  // goes beside the record, in <record>.variants/NAME-HASH.cuh, declared by a `variant NAME FILE`
  // line before the first spec that names it, so that `kiln warm` builds the record as it is.
  void record(const Unit& unit) {
    if (!config.record) return;
    // NOTE: one lock over the writes too: a variant's declaration must precede every spec line
    // that names it. Each spec is recorded once, so this is off the hot path.
    std::lock_guard lock(recorded_mutex);
    if (!recorded.insert(unit.spec).second) return;
    const KernelSpec& kernel = unit.kernel;
    if (!kernel.variant_code.empty()) {
      const std::string file =
          fmt::format("{}.variants/{}-{}.cuh", config.record->filename().string(),
                      kernel.variant_name, variant_hash(kernel.variant_code));
      if (recorded.insert(file).second) {
        write_record_file(config.record->parent_path() / file, kernel.variant_code);
        append_line(*config.record, fmt::format("variant {} {}", kernel.variant_name, file));
      }
    }
    append_line(*config.record, unit.spec);
  }

  static void add(std::atomic<std::uint64_t>& total_us, double ms) {
    total_us.fetch_add(static_cast<std::uint64_t>(ms * 1000.0));
  }

  Config config;
  detail::SourceTree sources;
  detail::DiskCache disk;
  // NOTE: declared after `disk`, where the compilers keep their fact memos, and before all that
  // the drivers made (loaded kernels, device memory), which must go back while they are open.
  detail::Backends backends;

  detail::StreamZeros stream_zeros;

  detail::SingleFlight<std::shared_ptr<LoadedKernel>> memory;
  detail::SingleFlight<KernelInfo> on_disk;
  // The hot path's shortcut: spec as the caller wrote it (hashed, not printed) -> loaded kernel.
  std::shared_mutex by_spec_mutex;
  std::unordered_map<KernelSpec, std::shared_ptr<LoadedKernel>> by_spec;
  std::mutex recorded_mutex;
  // Canonical specs (target included), and the variant code files written beside the record.
  std::unordered_set<std::string> recorded;

  std::atomic<std::uint64_t> stats_memory_hits{0}, stats_disk_hits{0}, stats_compiles{0},
      stats_compile_failures{0}, stats_loads{0}, stats_compile_us{0}, stats_load_us{0};
};

Runtime::Runtime(Options options) : impl_(std::make_unique<Impl>(options)) {}
Runtime::~Runtime() = default;

Kernel Runtime::kernel(const KernelSpec& spec, void* stream) {
  {
    std::shared_lock lock(impl_->by_spec_mutex);
    if (auto it = impl_->by_spec.find(spec); it != impl_->by_spec.end()) {
      impl_->stats_memory_hits.fetch_add(1, std::memory_order_relaxed);
      return Kernel(it->second);
    }
  }
  const Unit unit = impl_->unit_of(spec);
  impl_->record(unit);
  auto kernel = impl_->loaded(unit, true, stream).first;
  std::unique_lock lock(impl_->by_spec_mutex);
  impl_->by_spec.emplace(spec, kernel);
  return Kernel(std::move(kernel));
}

KernelInfo Runtime::compile(const KernelSpec& spec) {
  return impl_->compiled(impl_->unit_of(spec)).first;
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
        if (options.load && impl_->backends.loads_on_device(unit.target)) {
          item.status = impl_->loaded(unit, false).second;
        } else {
          item.status = impl_->compiled(unit).second;
        }
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

bool Runtime::debug() const {
  return impl_->config.debug;
}

void* Runtime::allocate_async(std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  return impl_->backends.device_driver("allocate device memory", "")
      .allocate_async(impl_->config.device, bytes, stream);
}

void Runtime::free_async(void* pointer, void* stream) {
  if (pointer == nullptr) return;
  impl_->backends.device_driver("free device memory", "")
      .free_async(impl_->config.device, pointer, stream);
}

void Runtime::zero_async(void* pointer, std::size_t bytes, void* stream) {
  if (bytes == 0) return;
  impl_->backends.device_driver("zero device memory", "")
      .zero_async(impl_->config.device, pointer, bytes, stream);
}

void Runtime::encode_tensor_map(void* map, const TensorMapLayout& layout) {
  impl_->backends.device_driver("make a TMA descriptor", "").encode_tensor_map(map, layout);
}

std::shared_ptr<void> Runtime::stream_zeros(std::size_t bytes, void* stream) {
  if (bytes == 0) return nullptr;
  Driver& d = impl_->backends.device_driver("allocate device memory", "");
  const int device = impl_->config.device;
  // NOTE: capture first: the driver refuses to name a capturing stream.
  if (d.is_capturing(device, stream)) return nullptr;
  const std::optional<std::uint64_t> id = d.stream_id(device, stream);
  return id ? impl_->stream_zeros.get(d, device, *id, bytes, stream) : nullptr;
}

void Runtime::copy_to_host(void* host, const void* device_pointer, std::size_t bytes,
                           void* stream) {
  if (bytes == 0) return;
  impl_->backends.device_driver("copy device memory to the host", "")
      .copy_to_host(impl_->config.device, host, device_pointer, bytes, stream);
}

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
  Stats s;
  s.memory_hits = impl_->stats_memory_hits.load();
  s.disk_hits = impl_->stats_disk_hits.load();
  s.compiles = impl_->stats_compiles.load();
  s.compile_failures = impl_->stats_compile_failures.load();
  s.loads = impl_->stats_loads.load();
  s.compile_ms = static_cast<double>(impl_->stats_compile_us.load()) / 1000.0;
  s.load_ms = static_cast<double>(impl_->stats_load_us.load()) / 1000.0;
  return s;
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
