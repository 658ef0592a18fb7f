// SPDX-License-Identifier: Apache-2.0
// KernelStore: memory, then disk, then compile; loaded once per key.
#include "runtime/kernel_store.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/file_io.hpp"
#include "cache/stats.hpp"
#include "cache/trust.hpp"
#include "core/elapsed.hpp"
#include "core/log.hpp"
#include "kiln/error.hpp"

namespace kiln::detail {
namespace {

void add(std::atomic<std::uint64_t>& total_us, double ms) {
  total_us.fetch_add(static_cast<std::uint64_t>(ms * 1000.0));
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

// Compile dumps hold the user's variant code: only their owner may read them.
constexpr mode_t kDumpMode = 0600;
// How many units of failed compiles the private dump directory keeps, the newest: enough for a
// person to read the last few failures, and no pile-up over months of runs.
constexpr std::size_t kKeptFailures = 16;
constexpr Guarded kDumpGuarded{"kiln's compile dumps", "replace or remove the dumps there",
                               "rewrite it"};

// Writes `text` to `name` in the open directory `dir`, published whole: whatever was at `name`
// (a link, a FIFO) is replaced, never followed or waited on. Returns an errno.
int dump_file(int dir, const std::string& name, std::string_view text) {
  return publish(dir, name, kDumpMode, [&](int fd) { return write_all(fd, text); });
}

// Removes all but the newest `keep` units of failed compiles (kiln_<key>.cu) from `dir`.
void keep_newest_failures(int dir, std::size_t keep) {
  std::vector<std::pair<std::int64_t, std::string>> units;  // (mtime in ns, name)
  for (std::string& name : dir_names(dir)) {
    struct stat info {};
    if (name.starts_with("kiln_") && name.ends_with(".cu") &&
        ::fstatat(dir, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(info.st_mode)) {
      units.emplace_back(info.st_mtim.tv_sec * 1'000'000'000 + info.st_mtim.tv_nsec,
                         std::move(name));
    }
  }
  if (units.size() <= keep) return;
  std::sort(units.begin(), units.end(), std::greater<>());
  for (std::size_t i = keep; i < units.size(); ++i) ::unlinkat(dir, units[i].second.c_str(), 0);
}

}  // namespace

// An entry found on disk or compiled, and how it was obtained.
struct KernelStore::Obtained {
  Entry entry;
  WarmupStatus status;
};

KernelStore::KernelStore(const Config& config, const SourceTree& sources, DiskCache& disk,
                         Backends& backends)
    : config_(config), sources_(sources), disk_(disk), backends_(backends) {}

std::shared_ptr<LoadedKernel> KernelStore::load(const KernelSpec& spec, const Unit& unit,
                                                void* stream) {
  auto kernel = loaded(unit, true, stream).first;
  std::unique_lock lock(by_spec_mutex_);
  by_spec_.emplace(spec, kernel);
  return kernel;
}

WarmupStatus KernelStore::warm(const Unit& unit, bool load) {
  if (load && backends_.loads_on_device(unit.target)) return loaded(unit, false).second;
  return compiled(unit).second;
}

Stats KernelStore::stats() const {
  Stats s;
  s.memory_hits = memory_hits_.load();
  s.disk_hits = disk_hits_.load();
  s.compiles = compiles_.load();
  s.compile_failures = compile_failures_.load();
  s.loads = loads_.load();
  s.compile_ms = static_cast<double>(compile_us_.load()) / 1000.0;
  s.load_ms = static_cast<double>(load_us_.load()) / 1000.0;
  return s;
}

std::pair<std::shared_ptr<LoadedKernel>, WarmupStatus> KernelStore::loaded(const Unit& unit,
                                                                           bool hot_path,
                                                                           void* stream) {
  backends_.require_device(unit.spec, unit.target);
  bool computed = false;
  WarmupStatus status = WarmupStatus::memory_hit;
  auto kernel = memory_.get(
      unit.key,
      [&] {
        if (hot_path && backends_.driver()->is_capturing(config_.device, stream)) {
          throw Error(ErrorCategory::invalid_argument,
                      fmt::format("not warmed: {} (key {}) is not loaded, and its stream is "
                                  "capturing a graph, during which no kernel can be loaded or "
                                  "compiled: warm these specs before capturing ({}; after "
                                  "`kiln warm`, one uncaptured call loads them), or make one "
                                  "uncaptured call with the same shapes first",
                                  unit.spec, unit.key.hex(), knob_name(Knob::warmup)));
        }
        Obtained found = obtain(unit, hot_path);
        status = found.status;
        try {
          return load_entry(unit, found.entry);
        } catch (const Error& e) {
          if (found.status != WarmupStatus::disk_hit) throw;
          warn_once(unit.key.hex(), fmt::format("cached {} (key {}) did not load ({}); recompiling",
                                                unit.spec, unit.key.hex(), e.what()));
          disk_.remove(unit.key);
          Entry rebuilt = compile_unit(unit, hot_path);
          disk_.store(rebuilt);
          status = WarmupStatus::compiled;
          return load_entry(unit, rebuilt);
        }
      },
      &computed);
  if (!computed) memory_hits_.fetch_add(1);
  return {kernel, computed ? status : WarmupStatus::memory_hit};
}

std::pair<KernelInfo, WarmupStatus> KernelStore::compiled(const Unit& unit) {
  if (auto kernel = memory_.find(unit.key)) return {(*kernel)->info, WarmupStatus::memory_hit};
  bool computed = false;
  WarmupStatus status = WarmupStatus::disk_hit;
  KernelInfo info = on_disk_.get(
      unit.key,
      [&] {
        Obtained found = obtain(unit, false);
        status = found.status;
        return info_of(found.entry);
      },
      &computed);
  return {info, computed ? status : WarmupStatus::memory_hit};
}

KernelStore::Obtained KernelStore::disk_hit(Entry entry) {
  disk_hits_.fetch_add(1);
  tally(disk_, CacheEvent::disk_hit, entry.meta.compile_ms);
  return {std::move(entry), WarmupStatus::disk_hit};
}

KernelStore::Obtained KernelStore::obtain(const Unit& unit, bool hot_path) {
  if (auto entry = disk_.load(unit.key, unit.spec)) return disk_hit(std::move(*entry));
  if (hot_path && config_.jit == JitMode::strict) {
    throw Error(ErrorCategory::not_found,
                fmt::format("{} (key {}) is not cached and KILN_JIT=strict forbids compiling on "
                            "the hot path: warm it first ({}), or set KILN_JIT=on",
                            unit.spec, unit.key.hex(), knob_name(Knob::warmup)));
  }
  // Another process may be compiling the same key: wait for it, then look again.
  const auto lock = disk_.lock(unit.key);
  if (auto entry = disk_.load(unit.key, unit.spec)) return disk_hit(std::move(*entry));
  Entry entry = compile_unit(unit, hot_path);
  disk_.store(entry);
  return {std::move(entry), WarmupStatus::compiled};
}

// `hot_path`: the compile stalls a call (Runtime::kernel), so it is said at the default level.
Entry KernelStore::compile_unit(const Unit& asked, bool hot_path) {
  if (config_.jit == JitMode::off) {
    throw Error(ErrorCategory::not_found,
                fmt::format("{} (key {}) is not cached and KILN_JIT=off forbids compiling: "
                            "warm the cache where compiling is allowed, or set KILN_JIT=on",
                            asked.spec, asked.key.hex()));
  }
  const Compiler& c = backends_.compiler(asked.target.vendor()).real();
  // NOTE: `asked` was keyed with the fact memo's answers. A binary must be stored under the
  // key its own compiler gives, and built with that compiler's options, so the unit is made
  // again from the real compiler (0.1 ms beside a compile): the same key, unless the memo was
  // out of date, which loading the compiler has just corrected.
  const Unit unit = make_unit(asked.kernel, asked.target, sources_, c);
  if (unit.key != asked.key) {
    log(LogLevel::info,
        "{} is stored under key {}, not {}: the compiler memo or a "
        "source changed since that key was computed",
        unit.spec, unit.key.hex(), asked.key.hex());
  }
  const CompileResult result = c.compile({
      .name = fmt::format("kiln_{}.cu", unit.key.hex()),
      .source = unit.source,
      .headers = unit.headers,
      .options = unit.options,
      .name_expression = unit.name_expression,
  });
  compiles_.fetch_add(1);
  add(compile_us_, result.ms);
  tally(disk_, result.ok ? CacheEvent::compiled : CacheEvent::compile_failed, result.ms);
  const std::string dumped = dump(unit, result);
  if (!result.ok) {
    compile_failures_.fetch_add(1);
    throw CompileError({result.log, unit.spec, fmt::format("{}", fmt::join(unit.options, " ")),
                        unit.key.hex(), dumped.empty() ? dump_failure(unit) : dumped});
  }
  const std::string details = fmt::format("key {}, {} registers, {} spill bytes", unit.key.hex(),
                                          result.usage.registers, result.usage.spill_bytes);
  if (hot_path) {
    // NOTE: a JIT of seconds inside a call looks like a hang to whoever runs the process.
    note(fmt::format(
        "compiled {} in {:.0f} ms, inside the call that first needed it ({}); to compile "
        "ahead of time, list a run's specs with KILN_RECORD=FILE and warm them with `kiln "
        "warm FILE`",
        unit.spec, result.ms, details));
  } else {
    log(LogLevel::info, "compiled {} in {:.0f} ms ({})", unit.spec, result.ms, details);
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

// KILN_DUMP_DIR: the generated unit, log, intermediate and binary of each compile. Returns the
// unit's path, or empty when it could not be written (one warning).
std::string KernelStore::dump(const Unit& unit, const CompileResult& result) {
  if (!config_.dump_dir) return {};
  const std::filesystem::path& dir_path = *config_.dump_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir_path, ec);
  const Fd dir(::open(dir_path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  const std::string base = unit.key.hex();
  const std::string_view binary{reinterpret_cast<const char*>(result.binary.data()),
                                result.binary.size()};
  std::vector<std::pair<std::string_view, std::string_view>> files = {{".cu", unit.source},
                                                                      {".log", result.log}};
  // NOTE: a failed compile has no binary, and AMD's compiler no intermediate.
  if (!result.intermediate.empty()) files.emplace_back(".ptx", result.intermediate);
  if (!binary.empty()) files.emplace_back(unit.target.amd() ? ".co" : ".cubin", binary);
  int error = dir.ok() ? 0 : dir.error();
  for (const auto& [extension, text] : files) {
    if (error == 0) error = dump_file(dir.get(), base + std::string(extension), text);
  }
  if (error == 0) return (dir_path / (base + ".cu")).string();
  warn_once("dump:" + dir_path.string(),
            fmt::format("cannot write compile dumps to {} ({}): set KILN_DUMP_DIR to a directory "
                        "you can write",
                        dir_path.string(), describe(error)));
  return {};
}

// With no dump directory, a failed compile still leaves its unit where a person can read it:
// <temp>/kiln-<uid>, a directory only this user may write (the rules of cache/trust.hpp), holding
// the newest kKeptFailures. Returns the unit's path, or empty after one warning saying why not.
std::string KernelStore::dump_failure(const Unit& unit) {
  std::error_code ec;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(ec);
  const std::string dir_name = fmt::format("kiln-{}", ::geteuid());
  const std::string name = fmt::format("kiln_{}.cu", unit.key.hex());
  std::string why = ec ? ec.message() : std::string();
  if (why.empty()) {
    CheckedDir parent = open_checked_parent(temp, kDumpGuarded);
    const CheckedDir dir =
        parent.fd.ok() ? open_checked_subdir(parent.fd.get(), temp, dir_name, 0700, kDumpGuarded)
                       : std::move(parent);
    int error = dir.fd.ok() ? 0 : dir.fd.error();
    if (dir.untrusted.empty() && error == 0) error = dump_file(dir.fd.get(), name, unit.source);
    if (dir.untrusted.empty() && error == 0) {
      keep_newest_failures(dir.fd.get(), kKeptFailures);
      return (temp / dir_name / name).string();
    }
    why = dir.untrusted.empty() ? describe(error) : dir.untrusted;
  }
  const std::filesystem::path dir_path = temp / dir_name;
  warn_once("dump:" + dir_path.string(),
            fmt::format("cannot keep the units of failed compiles in {} ({}); a compile error "
                        "still carries its log: set KILN_DUMP_DIR to a directory of your own to "
                        "keep them",
                        dir_path.string(), why));
  return {};
}

std::shared_ptr<LoadedKernel> KernelStore::load_entry(const Unit& unit, const Entry& entry) {
  Driver* d = backends_.driver();
  const auto start = Clock::now();
  auto loaded = std::make_shared<LoadedKernel>();
  loaded->function = d->load(config_.device, entry.binary, entry.meta.lowered_name);
  loaded->info = info_of(entry);
  loaded->params_size = unit.params->size;
  loads_.fetch_add(1);
  add(load_us_, ms_since(start));
  return loaded;
}

}  // namespace kiln::detail
