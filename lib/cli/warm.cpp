// `kiln warm`: compiles a manifest of specs (or the default set) into the cache, in parallel.
#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "jit/manifest.hpp"
#include "kiln/error.hpp"
#include "kiln/kiln.hpp"

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
  std::optional<std::filesystem::path> report;
};

// Every spec once for each target, which replaces the spec's own; no targets: the specs as
// written.
std::vector<KernelSpec> for_targets(const std::vector<KernelSpec>& specs,
                                    const std::vector<std::string>& targets) {
  if (targets.empty()) return specs;
  std::vector<KernelSpec> all;
  all.reserve(specs.size() * targets.size());
  for (const std::string& target : targets) {
    for (KernelSpec spec : specs) {
      spec.target = target;
      all.push_back(std::move(spec));
    }
  }
  return all;
}

// Every family's default set for each target; no targets: for the runtime's default target.
std::vector<KernelSpec> default_specs_for(const std::vector<std::string>& targets,
                                          const Runtime& runtime) {
  if (targets.empty()) return default_specs(runtime.target());
  std::vector<KernelSpec> all;
  for (const std::string& target : targets) {
    for (KernelSpec& spec : default_specs(target)) all.push_back(std::move(spec));
  }
  return all;
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
               elide_front(item.spec, columns > used ? columns - used : 0), tail);
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

void print_summary(const WarmupReport& report, double compile_ms) {
  std::string counts;
  for (WarmupStatus status : kStatuses) {
    counts += fmt::format("  {} {}", to_string(status), report.count(status));
  }
  fmt::print("warmed {} kernels in {}\n{}\n  compile time {} in total\n", report.items.size(),
             human_ms(report.wall_ms), counts, human_ms(compile_ms));

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
  // NOTE: warming fills the disk cache; without one it would compile for nothing.
  require_writable(open_disk_cache(to_options(args.common)));
  Runtime runtime(to_options(args.common));
  const std::vector<KernelSpec> specs = listed ? for_targets(*listed, args.common.targets)
                                               : default_specs_for(args.common.targets, runtime);
  const Progress progress(args.quiet);
  WarmupOptions options;
  options.threads = args.threads;
  // NOTE: this process exits right after; a module loaded on the device would be thrown away.
  options.load = false;
  options.on_progress = std::cref(progress);
  const WarmupReport report = runtime.warmup(specs, options);
  progress.finish();
  const double compile_ms = runtime.stats().compile_ms;
  print_summary(report, compile_ms);
  if (args.report) write_report(*args.report, report, compile_ms);
  return report.ok() ? kSuccess : kFailure;
}

}  // namespace

void add_warm_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<WarmArgs>();
  CLI::App* command = app.add_subcommand(
      "warm", "Compile a list of kernel specs into the cache, in parallel, and time each");
  add_common_options(*command, args->common, TargetCount::many);
  command
      ->add_option("manifest", args->manifest,
                   "File of canonical specs, one a line, `#` comments; default: the default "
                   "set of every kernel family")
      ->type_name("FILE");
  command->add_option("--threads", args->threads, "Compile threads; default: hardware threads")
      ->check(CLI::PositiveNumber);
  command->add_flag("--quiet", args->quiet, "Print no progress, only the summary");
  command->add_option("--report", args->report, "Write every item's result to FILE as JSON")
      ->type_name("FILE");
  command->callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace kiln::cli
