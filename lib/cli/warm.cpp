// SPDX-License-Identifier: Apache-2.0
// `kiln warm`: compiles a manifest of specs (or the default set) into the cache, in parallel.
#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.hpp"
#include "core/config.hpp"
#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.hpp"
#include "kiln/target.hpp"
#include "params/registry.hpp"

namespace kiln::cli {
namespace {

constexpr WarmupStatus kStatuses[] = {WarmupStatus::memory_hit, WarmupStatus::disk_hit,
                                      WarmupStatus::compiled, WarmupStatus::failed};
constexpr std::size_t kSlowestShown = 5;
constexpr std::size_t kBarWidth = 24;

struct WarmArgs {
  CommonArgs common;
  std::optional<std::filesystem::path> manifest;
  int threads = 0;
  bool quiet = false;
  bool list = false;
  bool elementwise = false;
  std::optional<std::filesystem::path> report;
};

// Every spec once for each target, which replaces the spec's own; no targets: the specs as
// written, those without a target given the runtime's default.
std::vector<KernelSpec> for_targets(const std::vector<KernelSpec>& specs,
                                    const std::vector<std::string>& targets,
                                    const Runtime& runtime) {
  std::vector<KernelSpec> all;
  if (targets.empty()) {
    all = specs;
    for (KernelSpec& spec : all) {
      if (spec.target.empty()) spec.target = runtime.target().name();
    }
    return all;
  }
  all.reserve(specs.size() * targets.size());
  for (const std::string& target : targets) {
    for (KernelSpec spec : specs) {
      spec.target = target;
      all.push_back(std::move(spec));
    }
  }
  return all;
}

// The default set for each target, with the elementwise kernels when asked for; no targets: for
// the runtime's default target.
std::vector<KernelSpec> default_specs_for(const std::vector<std::string>& targets, bool elementwise,
                                          const Runtime& runtime) {
  std::vector<KernelSpec> all;
  if (targets.empty()) {
    all = default_specs(runtime.target());
  } else {
    for (const std::string& target : targets) {
      for (KernelSpec& spec : default_specs(target)) all.push_back(std::move(spec));
    }
  }
  if (elementwise) {
    for (KernelSpec& spec : for_targets(unary_default_specs(), targets, runtime)) {
      all.push_back(std::move(spec));
    }
  }
  return all;
}

// `specs` with each canonical spec once, in the order first given; `dropped` counts the rest.
std::vector<KernelSpec> without_duplicates(std::vector<KernelSpec> specs, std::size_t& dropped) {
  std::set<std::string> seen;
  const std::size_t given = specs.size();
  std::erase_if(specs,
                [&](const KernelSpec& spec) { return !seen.insert(to_string(spec)).second; });
  dropped = given - specs.size();
  return specs;
}

// `spec.target`, checked before anything compiles: a target that is no target, or whose
// compiler is missing or refuses it, would fail every spec written for it, each at length.
void check_target(const KernelSpec& spec, const RuntimeInfo& info, Runtime& runtime) {
  const Target target(spec.target);  // names the target it probably meant
  for (const BackendInfo& backend : info.backends) {
    if (backend.name == target.backend() && !backend.compiler_found) {
      throw Error(ErrorCategory::not_found,
                  fmt::format("cannot build for target '{}': {}", spec.target, backend.compiler));
    }
  }
  try {
    // Computing the key asks the compiler whether it builds for the target.
    runtime.key(spec);
  } catch (const Error& e) {
    // NOTE: only the target's refusal is unsupported here; whatever else is wrong with this one
    // spec is its item's failure, reported with the others.
    if (e.category() == ErrorCategory::unsupported) throw;
  }
}

void check_targets(const std::vector<KernelSpec>& specs, Runtime& runtime) {
  const RuntimeInfo info = runtime.info();
  std::set<std::string> checked;
  for (const KernelSpec& spec : specs) {
    if (checked.insert(spec.target).second) check_target(spec, info, runtime);
  }
}

// What tells one spec from its neighbours, for people, in the progress bar: "unary
// block_size=256 dtype=f32 items_per_thread=4 op=sin @sm_90a", enumerations by name, without the
// source and Params type, which follow from the kernel. Deliberately not spec syntax: the specs
// to copy are those of the log lines, the summary and --report.
std::string label(std::string_view spec) {
  const std::size_t entry = spec.find(':') + 1;
  const std::size_t open = spec.find('<', entry);
  const std::size_t params = spec.rfind(">(");
  const std::size_t after = spec.find(')', params);
  if (open == std::string_view::npos || params == std::string_view::npos || params < open ||
      after == std::string_view::npos) {
    return std::string(spec);
  }
  const std::string_view name = spec.substr(entry, open - entry);
  std::string text(name.starts_with("kiln::") ? name.substr(6) : name);
  std::string_view constants = spec.substr(open + 1, params - open - 1);
  while (!constants.empty()) {
    const std::size_t comma = std::min(constants.find(','), constants.size());
    const std::string_view item = constants.substr(0, comma);
    constants.remove_prefix(std::min(comma + 1, constants.size()));
    const std::size_t eq = item.find('=');
    std::int64_t value = 0;
    const std::string_view number = item.substr(eq + 1);
    const bool integer = eq != std::string_view::npos &&
                         std::from_chars(number.data(), number.data() + number.size(), value).ptr ==
                             number.data() + number.size();
    const std::string_view named =
        integer ? detail::value_name(name, item.substr(0, eq), value) : std::string_view();
    text +=
        named.empty() ? fmt::format(" {}", item) : fmt::format(" {}={}", item.substr(0, eq), named);
  }
  return text.append(spec.substr(after + 1));
}

// `text` in at most `width` characters; a longer one keeps its end, where a spec's constants and
// target differ from its neighbours'.
std::string elide_front(const std::string& text, std::size_t width) {
  constexpr std::string_view kEllipsis = "...";
  if (text.size() <= width) return text;
  if (width <= kEllipsis.size()) return text.substr(text.size() - width);
  return std::string(kEllipsis) + text.substr(text.size() - (width - kEllipsis.size()));
}

// A bar redrawn in place when stderr is a terminal, else one line per finished item.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), terminal_(::isatty(STDERR_FILENO) == 1) {}

  void operator()(const WarmupProgress& progress) const {
    if (quiet_) return;
    const WarmupItem& item = *progress.last;
    if (!terminal_) {
      // NOTE: the whole spec, which `kiln compile` and manifests read back.
      fmt::print(stderr, "[{}/{}] {:<8} {:>8}  {}\n", progress.done, progress.total,
                 to_string(item.status), human_ms(item.ms), item.spec);
      return;
    }
    const std::size_t filled = kBarWidth * progress.done / progress.total;
    std::string bar(filled, '=');
    if (filled < kBarWidth) bar += '>';
    const std::string head =
        fmt::format("[{:<{}}] {}/{}  ", bar, kBarWidth, progress.done, progress.total);
    const std::string tail = " " + human_ms(item.ms);
    // NOTE: a line wider than the terminal wraps, and \r would then redraw only its last row.
    const std::size_t columns = terminal_columns() - 1;
    const std::size_t used = head.size() + tail.size();
    fmt::print(stderr, "\r{}{}{}\033[K", head,
               elide_front(label(item.spec), columns > used ? columns - used : 0), tail);
    std::fflush(stderr);
  }

  // Clears the bar so that the summary starts on a clean line.
  void finish() const {
    if (!quiet_ && terminal_) fmt::print(stderr, "\r\033[K");
  }

 private:
  static std::size_t terminal_columns() {
    winsize size{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) != 0 || size.ws_col == 0) return 80;
    return size.ws_col;
  }

  bool quiet_;
  bool terminal_;
};

// Warming is for the disk cache: a kernel compiled into memory alone is lost when kiln exits.
// The items compiled that are not in the writable tier now: a store failed (a warning said
// why), or the cap evicted them.
std::vector<const WarmupItem*> not_stored(const WarmupReport& report,
                                          const detail::DiskCache& cache) {
  std::set<std::string> stored;
  for (const detail::EntryStatus& entry : cache.list(/*verify=*/false)) {
    if (entry.key) stored.insert(entry.key->hex());
  }
  std::vector<const WarmupItem*> missing;
  for (const WarmupItem& item : report.items) {
    if (item.status == WarmupStatus::compiled && !stored.contains(item.key)) {
      missing.push_back(&item);
    }
  }
  return missing;
}

void print_summary(const WarmupReport& report, double compile_ms, std::size_t duplicates) {
  std::string counts;
  for (WarmupStatus status : kStatuses) {
    counts += fmt::format("  {} {}", to_string(status), report.count(status));
  }
  fmt::print("warmed {} kernels in {}{}\n{}\n  compile time {} in total\n", report.items.size(),
             human_ms(report.wall_ms),
             duplicates ? fmt::format(" ({} duplicate specs skipped)", duplicates) : "", counts,
             human_ms(compile_ms));

  std::vector<const WarmupItem*> slowest;
  for (const WarmupItem& item : report.items) slowest.push_back(&item);
  const std::size_t shown = std::min(kSlowestShown, slowest.size());
  std::partial_sort(slowest.begin(), slowest.begin() + static_cast<std::ptrdiff_t>(shown),
                    slowest.end(),
                    [](const WarmupItem* a, const WarmupItem* b) { return a->ms > b->ms; });
  std::vector<std::vector<std::string>> rows;
  for (std::size_t i = 0; i < shown; ++i) {
    rows.push_back(
        {human_ms(slowest[i]->ms), std::string(to_string(slowest[i]->status)), slowest[i]->spec});
  }
  if (!rows.empty()) {
    fmt::print("slowest\n");
    print_table(stdout, {"TIME", "STATUS", "SPEC"}, rows);
  }

  for (const WarmupItem& item : report.items) {
    if (item.status != WarmupStatus::failed) continue;
    // A compile error's message spans many lines; indenting them all keeps each under its spec.
    std::string message = item.error;
    while (message.ends_with('\n')) message.pop_back();
    for (std::size_t at = message.find('\n'); at != std::string::npos;
         at = message.find('\n', at + 3)) {
      message.replace(at, 1, "\n  ");
    }
    fmt::print("failed: {}\n  {}\n", item.spec, message);
  }
}

// Where the kernels went, and how full that is. False when some compiled kernel is not there.
bool print_cache(const WarmupReport& report, const detail::DiskCache& cache,
                 std::uint64_t max_bytes) {
  const std::string root = cache.root()->string();
  fmt::print("cache {}: {} entries, {}{}\n", root, cache.list(/*verify=*/false).size(),
             human_bytes(cache.size_bytes()),
             max_bytes ? fmt::format(" of a {} cap (KILN_CACHE_MAX_BYTES)", human_bytes(max_bytes))
                       : std::string(" (no cap: KILN_CACHE_MAX_BYTES sets one)"));
  const std::vector<const WarmupItem*> missing = not_stored(report, cache);
  for (const WarmupItem* item : missing) fmt::print("not stored: {}\n", item->spec);
  if (missing.empty()) return true;
  fmt::print("{} of {} compiled kernels are not in {}: {}\n", missing.size(),
             report.count(WarmupStatus::compiled), root,
             max_bytes
                 ? fmt::format("the {} cap evicted them, or storing them failed (see the "
                               "warnings above); raise KILN_CACHE_MAX_BYTES, or free space",
                               human_bytes(max_bytes))
                 : std::string("storing them failed (see the warnings above); make the directory "
                               "writable, or free space"));
  return false;
}

void write_report(const std::filesystem::path& path, const WarmupReport& report,
                  double compile_ms) {
  nlohmann::ordered_json counts;
  for (WarmupStatus status : kStatuses) {
    counts[std::string(to_string(status))] = report.count(status);
  }
  nlohmann::ordered_json items = nlohmann::ordered_json::array();
  for (const WarmupItem& item : report.items) {
    items.push_back({{"spec", item.spec},
                     {"key", item.key},
                     {"status", to_string(item.status)},
                     {"ms", item.ms},
                     {"error", item.error}});
  }
  const nlohmann::ordered_json json = {{"wall_ms", report.wall_ms},
                                       {"compile_ms", compile_ms},
                                       {"counts", counts},
                                       {"items", items}};
  std::ofstream out(path, std::ios::trunc);
  out << json.dump(2) << '\n';
  if (!out) {
    throw Error(ErrorCategory::invalid_argument,
                fmt::format("cannot write the report {}: {}", path.string(), std::strerror(errno)));
  }
}

int run(const WarmArgs& args) {
  // NOTE: the manifest is read first, so that a bad one fails before the cache is touched.
  const std::optional<std::vector<KernelSpec>> listed =
      args.manifest ? std::optional(detail::read_manifest(*args.manifest)) : std::nullopt;
  const Options options = to_options(args.common);
  // NOTE: warming fills the disk cache; without one it would compile for nothing.
  const detail::DiskCache cache = open_disk_cache(options, /*create_root=*/true);
  if (!args.list) require_writable(cache);
  Runtime runtime(options);
  std::size_t duplicates = 0;
  const std::vector<KernelSpec> specs =
      without_duplicates(listed ? for_targets(*listed, args.common.targets, runtime)
                                : default_specs_for(args.common.targets, args.elementwise, runtime),
                         duplicates);
  check_targets(specs, runtime);
  if (args.list) {
    for (const KernelSpec& spec : specs) fmt::print("{}\n", to_string(spec));
    return kSuccess;
  }
  const Progress progress(args.quiet);
  WarmupOptions warmup;
  warmup.threads = args.threads;
  // NOTE: this process exits right after; a module loaded on the device would be thrown away.
  warmup.load = false;
  warmup.on_progress = std::cref(progress);
  const WarmupReport report = runtime.warmup(specs, warmup);
  progress.finish();
  const double compile_ms = runtime.stats().compile_ms;
  print_summary(report, compile_ms, duplicates);
  const bool stored = print_cache(report, cache, detail::resolve_config(options).cache_max_bytes);
  if (args.report) write_report(*args.report, report, compile_ms);
  return report.ok() && stored ? kSuccess : kFailure;
}

// --threads: a count, or 0 for one per hardware thread (WarmupOptions::threads).
std::string check_threads(const std::string& text) {
  int threads = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), threads);
  if (ec == std::errc() && end == text.data() + text.size() && threads >= 0) return {};
  return fmt::format(
      "'{}' is not a thread count: give a whole number from 1 to {}, or 0 for one "
      "per hardware thread",
      text, std::numeric_limits<int>::max());
}

}  // namespace

void add_warm_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<WarmArgs>();
  CLI::App* command = app.add_subcommand(
      "warm", "Compile a list of kernel specs into the cache, in parallel, and time each");
  add_common_options(*command, args->common, TargetCount::many);
  CLI::Option* manifest =
      command->add_option("manifest", args->manifest,
                          "File of canonical specs, one a line, `#` comments, `variant NAME FILE` "
                          "lines giving user variants' code; default: the attention and decode "
                          "kernels' default set");
  manifest->type_name("FILE");
  command
      ->add_flag("--elementwise", args->elementwise,
                 "Add every elementwise kernel (each unary op and dtype) to the default set")
      ->excludes(manifest);
  command
      ->add_option("--threads", args->threads,
                   "Compile threads; default and 0: one per hardware thread")
      ->check(CLI::Validator(check_threads, "N"));
  command->add_flag("--list", args->list,
                    "Print the specs it would compile, as a manifest, and exit");
  command->add_flag("--quiet", args->quiet, "Print no progress, only the summary");
  command->add_option("--report", args->report, "Write every item's result to FILE as JSON")
      ->type_name("FILE");
  command->callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace kiln::cli
