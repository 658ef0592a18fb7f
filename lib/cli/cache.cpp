// SPDX-License-Identifier: Apache-2.0
// `kiln cache ls|stats|verify|prune|clear`: inspects and trims the writable disk cache tier.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>

#include "cache/stats.hpp"
#include "cli/commands.hpp"
#include "core/config.hpp"
#include "kiln/error.hpp"

namespace kiln::cli {
namespace {

struct LsArgs {
  CommonArgs common;
  bool json = false;
  std::string sort = "name";
};

struct StatsArgs {
  CommonArgs common;
  bool zero = false;
};

struct VerifyArgs {
  CommonArgs common;
  bool fix = false;
};

struct PruneArgs {
  CommonArgs common;
  std::string max_bytes;
};

}  // namespace

void require_writable(const detail::DiskCache& cache) {
  if (cache.writable()) return;
  if (!cache.root()) {
    throw Error(ErrorCategory::cache,
                "there is no cache directory (HOME and XDG_CACHE_HOME are unset): pass "
                "--cache-dir or set KILN_CACHE_DIR");
  }
  if (cache.root_missing()) {
    throw Error(ErrorCategory::cache,
                fmt::format("the cache directory {} does not exist: check --cache-dir and "
                            "KILN_CACHE_DIR (kiln creates it when it first stores a kernel)",
                            cache.root()->string()));
  }
  if (!cache.untrusted().empty()) {
    throw Error(ErrorCategory::cache, fmt::format("the cache directory {} is not safe to use: {}",
                                                  cache.root()->string(), cache.untrusted()));
  }
  throw Error(ErrorCategory::cache,
              fmt::format("the cache directory {} cannot be created or written: pass --cache-dir "
                          "or set KILN_CACHE_DIR to a writable directory",
                          cache.root()->string()));
}

namespace {

std::string key_of(const detail::EntryStatus& entry) {
  return entry.key ? entry.key->hex() : entry.path.filename().string();
}

std::string local_time(std::int64_t seconds) {
  return fmt::format("{:%Y-%m-%d %H:%M:%S}", fmt::localtime(static_cast<std::time_t>(seconds)));
}

std::vector<detail::EntryStatus> invalid_entries(const detail::DiskCache& cache) {
  std::vector<detail::EntryStatus> entries = cache.list(/*verify=*/true);
  std::erase_if(entries, [](const detail::EntryStatus& entry) { return entry.valid; });
  return entries;
}

// What `kiln cache ls` sorts by: an entry's spec, the one name a user knows it by (a bad
// entry, which has none, by its path), or its size, largest first.
void sort_entries(std::vector<detail::EntryStatus>& entries, std::string_view by) {
  const auto name = [](const detail::EntryStatus& entry) {
    return entry.meta ? entry.meta->spec : entry.path.string();
  };
  std::sort(entries.begin(), entries.end(), [&](const auto& a, const auto& b) {
    if (by == "size" && a.size != b.size) return a.size > b.size;
    return name(a) < name(b);
  });
}

int ls(const LsArgs& args) {
  const detail::DiskCache cache = open_disk_cache(to_options(args.common), /*create_root=*/false);
  require_writable(cache);
  // NOTE: verifying reads every entry in full, but only a verified entry's spec can be trusted.
  std::vector<detail::EntryStatus> entries = cache.list(/*verify=*/true);
  sort_entries(entries, args.sort);
  if (args.json) {
    nlohmann::ordered_json json = nlohmann::ordered_json::array();
    for (const detail::EntryStatus& entry : entries) {
      json.push_back({{"key", key_of(entry)},
                      {"path", entry.path.string()},
                      {"size", entry.size},
                      {"last_used", entry.last_used},
                      {"valid", entry.valid},
                      {"problem", entry.problem},
                      {"spec", entry.meta ? entry.meta->spec : ""},
                      {"compiler", entry.meta ? entry.meta->compiler : ""}});
    }
    fmt::print("{}\n", json.dump(2));
    return kSuccess;
  }
  std::vector<std::vector<std::string>> rows;
  std::uint64_t total = 0;
  for (const detail::EntryStatus& entry : entries) {
    rows.push_back({key_of(entry), human_bytes(entry.size), local_time(entry.last_used),
                    entry.meta ? entry.meta->spec : "invalid: " + entry.problem});
    total += entry.size;
  }
  print_table(stdout, {"KEY", "SIZE", "LAST USED", "SPEC"}, rows);
  fmt::print("{} entries, {} in {}\n", entries.size(), human_bytes(total), cache.root()->string());
  // NOTE: lock files are not named: each key compiled keeps one, by design, of no size.
  if (const detail::Leftovers left = cache.leftovers(); left.temps > 0) {
    fmt::print(
        "also {} temp files ({}) of stores under way or killed (`kiln cache prune` removes those "
        "an hour old, `kiln cache clear` all)\n",
        left.temps, human_bytes(left.temp_bytes));
  }
  if (const std::vector<std::string> others = cache.other_formats(); !others.empty()) {
    fmt::print(
        "also there, in formats this kiln does not read: {} (`kiln cache clear` removes "
        "them)\n",
        fmt::join(others, ", "));
  }
  return kSuccess;
}

// Hits, misses and the time they saved or took, as every runtime that used the cache tallied
// them (cache/stats.hpp), like `ccache -s`.
int stats(const StatsArgs& args) {
  detail::DiskCache cache = open_disk_cache(to_options(args.common), /*create_root=*/false);
  require_writable(cache);
  if (args.zero) {
    detail::reset_tally(cache);
    fmt::print("statistics of {} zeroed\n", cache.root()->string());
    return kSuccess;
  }
  const detail::CacheTally tally = detail::read_tally(cache);
  const std::uint64_t misses = tally.compiles + tally.compile_failures;
  const std::uint64_t lookups = tally.disk_hits + misses;
  const auto field = [](std::string_view label, std::string_view value) {
    fmt::print("{:<16}{}\n", label, value);
  };
  field("cache directory", cache.root()->string());
  field("hits",
        fmt::format("{} (saved {} of compiling)", tally.disk_hits, human_ms(tally.saved_ms)));
  field("misses", fmt::format("{} ({} compiled, {} failed; {} compiling)", misses, tally.compiles,
                              tally.compile_failures, human_ms(tally.compile_ms)));
  field("hit rate", lookups ? fmt::format("{:.1f} %", 100.0 * static_cast<double>(tally.disk_hits) /
                                                          static_cast<double>(lookups))
                            : std::string("none yet"));
  std::uint64_t bytes = 0;
  const std::vector<detail::EntryStatus> entries = cache.list(/*verify=*/false);
  for (const detail::EntryStatus& entry : entries) bytes += entry.size;
  field("entries", fmt::format("{}, {}", entries.size(), human_bytes(bytes)));
  if (tally.full) {
    fmt::print("the tally is full and counts no more: `kiln cache stats --zero` starts it again\n");
  }
  return kSuccess;
}

int verify(const VerifyArgs& args) {
  detail::DiskCache cache = open_disk_cache(to_options(args.common), /*create_root=*/false);
  require_writable(cache);
  const std::vector<detail::EntryStatus> entries = cache.list(/*verify=*/true);
  std::size_t bad = 0;
  for (const detail::EntryStatus& entry : entries) {
    if (entry.valid) continue;
    fmt::print("bad: {}: {}\n", entry.path.string(), entry.problem);
    ++bad;
  }
  fmt::print("{} entries checked, {} bad\n", entries.size(), bad);
  if (bad == 0) return kSuccess;
  if (!args.fix) {
    fmt::print("run `kiln cache verify --fix` to remove them\n");
    return kFailure;
  }
  fmt::print("removed {} bad entries\n", cache.remove_invalid());
  // Whatever could not be removed is still bad; the caller must hear about it.
  const std::vector<detail::EntryStatus> remaining = invalid_entries(cache);
  for (const detail::EntryStatus& entry : remaining) {
    fmt::print("still bad: {}: {}\n", entry.path.string(), entry.problem);
  }
  return remaining.empty() ? kSuccess : kFailure;
}

int prune(const PruneArgs& args) {
  const std::uint64_t max_bytes = detail::parse_bytes(args.max_bytes, "--max-bytes");
  detail::DiskCache cache = open_disk_cache(to_options(args.common), /*create_root=*/false);
  require_writable(cache);
  const std::size_t removed = cache.prune(max_bytes);
  fmt::print("removed {} entries; {} holds {} (limit {})\n", removed, cache.root()->string(),
             human_bytes(cache.size_bytes()), human_bytes(max_bytes));
  return kSuccess;
}

int clear(const CommonArgs& args) {
  detail::DiskCache cache = open_disk_cache(to_options(args), /*create_root=*/false);
  require_writable(cache);
  fmt::print("removed {} entries from {}\n", cache.clear(), cache.root()->string());
  const std::vector<std::string> others = cache.other_formats();
  if (others.empty()) return kSuccess;
  const std::size_t removed = cache.remove_other_formats();
  fmt::print("removed {} of {} directories of other cache formats ({})\n", removed, others.size(),
             fmt::join(others, ", "));
  return removed == others.size() ? kSuccess : kFailure;
}

}  // namespace

void add_cache_commands(CLI::App& app, int& exit_code) {
  CLI::App* cache =
      app.add_subcommand("cache", "List, count the use of, verify, prune or clear the disk cache");
  cache->require_subcommand(0, 1);  // none: main prints the usage

  auto ls_args = std::make_shared<LsArgs>();
  CLI::App* ls_command = cache->add_subcommand("ls", "List entries: key, size, last use and spec");
  add_cache_options(*ls_command, ls_args->common);
  ls_command->add_flag("--json", ls_args->json, "Print the same as JSON");
  ls_command->add_option("--sort", ls_args->sort, "By spec (name, the default) or largest first")
      ->type_name("name|size")
      ->check(CLI::IsMember({"name", "size"}).description(""));
  ls_command->callback([ls_args, &exit_code] { exit_code = ls(*ls_args); });

  auto stats_args = std::make_shared<StatsArgs>();
  CLI::App* stats_command = cache->add_subcommand(
      "stats", "Count hits, misses and the compile time saved, over every process");
  add_cache_options(*stats_command, stats_args->common);
  stats_command->add_flag("--zero", stats_args->zero, "Start counting again from zero");
  stats_command->callback([stats_args, &exit_code] { exit_code = stats(*stats_args); });

  auto verify_args = std::make_shared<VerifyArgs>();
  CLI::App* verify_command =
      cache->add_subcommand("verify", "Check every entry; exit 1 if any is bad");
  add_cache_options(*verify_command, verify_args->common);
  verify_command->add_flag("--fix", verify_args->fix, "Remove the bad entries");
  verify_command->callback([verify_args, &exit_code] { exit_code = verify(*verify_args); });

  auto prune_args = std::make_shared<PruneArgs>();
  CLI::App* prune_command =
      cache->add_subcommand("prune", "Evict least recently used entries down to a size");
  add_cache_options(*prune_command, prune_args->common);
  prune_command
      ->add_option("--max-bytes", prune_args->max_bytes, "Size to keep, e.g. 1073741824, 512M, 8G")
      ->type_name("BYTES")
      ->required();
  prune_command->callback([prune_args, &exit_code] { exit_code = prune(*prune_args); });

  auto clear_args = std::make_shared<CommonArgs>();
  CLI::App* clear_command =
      cache->add_subcommand("clear", "Remove every entry, and other cache formats' directories");
  add_cache_options(*clear_command, *clear_args);
  clear_command->callback([clear_args, &exit_code] { exit_code = clear(*clear_args); });
}

}  // namespace kiln::cli
